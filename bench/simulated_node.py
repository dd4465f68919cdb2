"""A SIMULATED node agent, for bench/cluster.py only: the node agent's real API over claims and warm pools kept in
memory, starting no container. One machine cannot run 50 machines' containers; it can run 50 of these, which lets
it put 20,000 sandboxes behind one real router and measure what the router itself costs. Every figure taken with it
says it is simulated.

A stand-in is served as `rollbox node` serves a `LocalNode`: `rollbox.server.create_app(node, cluster_secret=...)`,
so the router under test meets the real routes, auth and wire shapes. Where the router looks, it answers as a
real node does: sandbox ids `<node name>-<hex>`, a health with the node's name, its room, its claims and its warm
pools (their labels kept: they carry the cluster's pool totals), and `CapacityExceeded` when full. What it cannot
do without containers it answers at once and always alike: a warm pool is full again as soon as a claim leaves room,
exec answers a fixed result, a sandbox holds no files (writes are dropped), and fork, snapshot, reset, pause, resume
and stats are not simulated.

Many stand-ins share one process and one event loop, each a uvicorn server on a listening socket of its own that
the process inherits: `simulated_nodes()` starts them. They keep nothing, so the process is stopped with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket as sockets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvloop

from rollbox.cli.cluster import SECRET_VARIABLE
from rollbox.errors import (
    CapacityExceeded,
    FileNotFound,
    InvalidRequest,
    NotFound,
    SandboxNotFound,
    SnapshotNotFound,
    TemplateNotFound,
)
from rollbox.models import (
    ApplyStatus,
    ClaimRequest,
    ExecRequest,
    ExecResult,
    SandboxInfo,
    SandboxStats,
    SnapshotInfo,
    TemplateInfo,
    WarmPoolInfo,
)
from rollbox.node.answers import Answers
from rollbox.node.base import FileOp, OutputCallback
from rollbox.node.keys import KEY_WINDOW
from rollbox.server import create_app
from rollbox.server.listen import listen_tcp, server
from rollbox.spec import Resource, SandboxTemplate, SandboxWarmPool

EXEC_RESULT = ExecResult(exit_code=0, duration_ms=0.0)
"""What every command answers."""
DROPPED_FILE_OPS = {"write": None, "mkdir": None, "list": [], "upload_tar": 0}
"""File operations that succeed on a sandbox with no files, and their answers; the others find no file."""
START_TIMEOUT = 30.0


class SimulatedNode:
    """The `Node` interface in memory, for one simulated node named `name` holding `max_sandboxes` at most."""

    def __init__(self, name: str, max_sandboxes: int) -> None:
        self.name = name
        self.max_sandboxes = max_sandboxes
        self.claimed: dict[str, SandboxInfo] = {}
        self.answers = Answers(KEY_WINDOW)
        self.built: dict[str, TemplateInfo] = {}
        self.pools: dict[str, SandboxWarmPool] = {}

    def ready(self) -> dict[str, int]:
        """Ready sandboxes per warm pool: each full within the room the claims leave, pools in name order."""
        room = self.max_sandboxes - len(self.claimed)
        ready = {}
        for name, pool in sorted(self.pools.items()):
            ready[name] = max(0, min(pool.spec.replicas, room))
            room -= ready[name]
        return ready

    # -- resources --------------------------------------------------------------------------

    async def apply(self, resource: Resource, progress: Callable[[str], None], tenant: str | None = None
                    ) -> ApplyStatus:
        name = resource.metadata.name
        if isinstance(resource, SandboxTemplate):
            spec = resource.model_dump(mode="json", by_alias=True)["spec"]
            before = self.built.get(name)
            if before is not None and before.spec == spec:
                return "unchanged"
            progress(f"simulated node {self.name}: template {name} built (nothing to build)")
            self.built[name] = TemplateInfo(name=name, spec=spec, built_at=time.time())
            return "created" if before is None else "configured"
        await self.template(resource.spec.sandbox_template_ref.name)
        held = self.pools.get(name)
        self.pools[name] = resource
        return "created" if held is None else "unchanged" if held == resource else "configured"

    async def templates(self) -> list[TemplateInfo]:
        return [self.built[name] for name in sorted(self.built)]

    async def template(self, name: str) -> TemplateInfo:
        if name not in self.built:
            raise TemplateNotFound(f"template {name!r} does not exist: apply it first")
        return self.built[name]

    async def delete_template(self, name: str) -> None:
        await self.template(name)
        del self.built[name]

    async def warmpools(self) -> list[WarmPoolInfo]:
        return [await self.warmpool(name) for name in sorted(self.pools)]

    async def warmpool(self, name: str) -> WarmPoolInfo:
        pool = self._pool(name)
        spec = pool.spec
        return WarmPoolInfo(name=name, template=spec.sandbox_template_ref.name, replicas=spec.replicas,
                            max_replicas=spec.max_replicas, target=spec.replicas, ready=self.ready()[name], starting=0,
                            labels=pool.metadata.labels, refill_concurrency=spec.refill_concurrency)

    async def delete_warmpool(self, name: str) -> None:
        self._pool(name)
        del self.pools[name]

    def _pool(self, name: str) -> SandboxWarmPool:
        if name not in self.pools:
            raise NotFound(f"warm pool {name!r} does not exist: apply it first")
        return self.pools[name]

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, tenant: str, request: ClaimRequest, *, warm_only: bool = False, retry: bool = False
                    ) -> SandboxInfo:
        """Request keys are not kept: each claim makes a sandbox."""
        if request.snapshot is not None:
            raise SnapshotNotFound("a simulated node holds no snapshots")
        if request.warmpool is not None:
            template = self._pool(request.warmpool).spec.sandbox_template_ref.name
        elif request.template is not None:
            template = (await self.template(request.template)).name
        else:
            raise InvalidRequest("give a template, a warm pool or a snapshot to create a sandbox from")
        if len(self.claimed) >= self.max_sandboxes:
            raise CapacityExceeded(f"simulated node {self.name} is full: {self.max_sandboxes} sandboxes")
        info = SandboxInfo(id=f"{self.name}-{secrets.token_hex(8)}", template=template, warmpool=request.warmpool,
                           tenant=tenant, state="running", created_at=time.time(),
                           idle_pause_after=request.idle_pause_after, labels=request.labels or {})
        self.claimed[info.id] = info
        return info

    async def answered(self, tenant: str, sandbox_id: str, taken: bool, attempt: str | None = None) -> None:
        if self.answers.answered(tenant, sandbox_id, taken, attempt):
            self.claimed.pop(sandbox_id, None)

    async def withdraw(self, attempts: list[str]) -> None:
        for _, sandbox_id in self.answers.withdraw(attempts):
            self.claimed.pop(sandbox_id, None)

    async def claims(self, tenant: str, request_key: str | None = None) -> list[SandboxInfo]:
        if request_key is not None:
            return []
        return [info for info in self.claimed.values() if info.tenant == tenant]

    async def get(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        info = self.claimed.get(sandbox_id)
        if info is None or info.tenant != tenant:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
        return info

    async def delete(self, tenant: str, sandbox_id: str) -> None:
        await self.get(tenant, sandbox_id)
        del self.claimed[sandbox_id]

    async def exec(self, tenant: str, sandbox_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult:
        await self.get(tenant, sandbox_id)
        return EXEC_RESULT

    async def files(self, tenant: str, sandbox_id: str, op: FileOp, path: str, **options: Any) -> Any:
        await self.get(tenant, sandbox_id)
        if op in DROPPED_FILE_OPS:
            return DROPPED_FILE_OPS[op]
        raise FileNotFound(f"{path!r} does not exist: a simulated sandbox holds no files")

    async def reset(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        raise _not_simulated("reset")

    async def fork(self, tenant: str, sandbox_id: str, count: int) -> list[SandboxInfo]:
        raise _not_simulated("fork")

    async def pause(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        raise _not_simulated("pause")

    async def resume(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        raise _not_simulated("resume")

    async def stats(self, tenant: str, sandbox_id: str) -> SandboxStats:
        raise _not_simulated("stats")

    # -- snapshots --------------------------------------------------------------------------

    async def snapshot(self, tenant: str, sandbox_id: str, name: str) -> SnapshotInfo:
        raise _not_simulated("snapshot")

    async def snapshots(self, tenant: str) -> list[SnapshotInfo]:
        return []

    async def delete_snapshot(self, tenant: str, name: str) -> None:
        raise SnapshotNotFound(f"snapshot {name!r} does not exist: a simulated node holds none")

    # -- operations -------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """As `LocalNode.health` reports a named node."""
        ready = self.ready()
        pools = {name: {"template": pool.spec.sandbox_template_ref.name, "replicas": pool.spec.replicas,
                        "ready": ready[name], "starting": 0, "refill_concurrency": pool.spec.refill_concurrency,
                        "labels": pool.metadata.labels}
                 for name, pool in self.pools.items()}
        return {"node": self.name, "sandboxes": len(self.claimed) + sum(ready.values()),
                "max_sandboxes": self.max_sandboxes, "claims": len(self.claimed), "pools": pools}


def _not_simulated(operation: str) -> InvalidRequest:
    return InvalidRequest(f"a simulated node does not {operation}: it starts no containers")


# -- serving many in one process -------------------------------------------------------------

async def serve(nodes: list[tuple[SimulatedNode, sockets.socket]], secret: str) -> None:
    """Each node's API on its listener, all on this event loop, until the process is killed."""
    await asyncio.gather(*(server(create_app(node, cluster_secret=secret), "warning").serve(sockets=[listener])
                           for node, listener in nodes))


@dataclass(frozen=True)
class SimulatedNodes:
    urls: list[str]
    pid: int


@contextlib.contextmanager
def simulated_nodes(count: int, max_sandboxes: int, secret: str) -> Iterator[SimulatedNodes]:
    """`count` simulated nodes named sim-00, sim-01, ..., each on a free loopback port, served by one child process
    (its own interpreter: its CPU time is not the router's nor this process's) once every one answers."""
    names = [f"sim-{index:02d}" for index in range(count)]
    listeners = [listen_tcp("127.0.0.1", 0) for _ in names]
    try:
        spec = {"max_sandboxes": max_sandboxes,
                "nodes": [[name, listener.fileno()] for name, listener in zip(names, listeners, strict=True)]}
        process = subprocess.Popen([sys.executable, __file__, json.dumps(spec)],
                                   pass_fds=[listener.fileno() for listener in listeners],
                                   env={**os.environ, SECRET_VARIABLE: secret})
        urls = [f"http://127.0.0.1:{listener.getsockname()[1]}" for listener in listeners]
    finally:
        for listener in listeners:
            listener.close()
    try:
        _wait_answering(urls, process)
        yield SimulatedNodes(urls, process.pid)
    finally:
        process.kill()
        process.wait()


def _wait_answering(urls: list[str], process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    with httpx.Client(timeout=1.0) as http:
        for url in urls:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if http.get(f"{url}/healthz").status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the simulated node at {url} did not start; see the output above")
                time.sleep(0.05)


def main() -> None:
    spec = json.loads(sys.argv[1])
    nodes = [(SimulatedNode(name, spec["max_sandboxes"]), sockets.socket(fileno=fd)) for name, fd in spec["nodes"]]
    uvloop.run(serve(nodes, os.environ[SECRET_VARIABLE]))


if __name__ == "__main__":
    main()
