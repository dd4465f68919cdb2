"""`ClusterNode`: the `Node` of a whole cluster, so the same server (`create_app`) that fronts one machine fronts
many. It places each claim on a node, and forwards every call on a sandbox to the node its id names.

Nothing here outlives the process: the sandbox id names its node (`<node>-<hex>`), the cluster engine lists the
nodes, and the nodes hold the claims and the warm pools' shares. So any number of routers can serve the same
cluster, and one that restarts has lost nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx

from rollbox._logs import throttled
from rollbox.cluster.claims import ClusterClaims
from rollbox.cluster.images import ClusterImages
from rollbox.cluster.pools import ClusterPool, read_pools
from rollbox.cluster.processes import ClusterProcesses
from rollbox.cluster.remote import RemoteNode, no_progress
from rollbox.cluster.tunnel import open_tunnel
from rollbox.cluster.view import RESTART_WAIT, NodeState
from rollbox.cluster.volumes import ClusterVolumes
from rollbox.cluster.watcher import SERVING, Members, Watcher, down, lost
from rollbox.cluster.withdrawals import Withdrawals
from rollbox.errors import InvalidRequest, NodeUnavailable, SandboxNotFound, TemplateNotFound
from rollbox.models import (
    ApplyStatus,
    ClaimRequest,
    ExecRequest,
    ExecResult,
    LeaseInfo,
    ModelCallLog,
    SandboxInfo,
    SandboxStats,
    SnapshotInfo,
    TemplateInfo,
    VolumeInfo,
    VolumeRequest,
    WarmPoolInfo,
)
from rollbox.node.base import FileOp, OutputCallback, PortStream
from rollbox.node.images import ImageOperations
from rollbox.spec import Network, Resource, SandboxTemplate

log = logging.getLogger("rollbox.cluster")
T = TypeVar("T")
__all__ = ["RESTART_WAIT", "ClusterNode"]


class ClusterNode(ImageOperations, ClusterProcesses):
    def __init__(self, members: Members, secret: str, *, node_capacity: int = 64, release_idle: bool = False,
                 tick: float | None = None, data_plane: str = "python") -> None:
        self._secret = secret
        self._remotes: dict[str, RemoteNode] = {}
        options = {} if tick is None else {"tick": tick}
        self.watcher = Watcher(members, self._remote, node_capacity=node_capacity, release_idle=release_idle,
                               **options)
        self._volumes = ClusterVolumes(self._remote, self._answering)
        self._images = self.image_service = ClusterImages(self._remote, self._answering, self._serving, self._on_each)
        self._claims = ClusterClaims(self.watcher, self._remote, self._answering, self._images, self._volumes)
        self.data_plane = data_plane
        """Who forwards commands and file calls to their nodes: "nginx" in front of the router, or the router
        itself (cluster/serve.py)."""

    @property
    def withdrawals(self) -> Withdrawals:
        """The claim answers dropped on their way, withdrawn on their nodes (the edge's too)."""
        return self._claims.withdrawals

    async def start(self) -> None:
        await self.watcher.start()

    async def close(self) -> None:
        await self.withdrawals.close()
        await self.watcher.close()
        for remote in self._remotes.values():
            await remote.close()

    def _remote(self, url: str) -> RemoteNode:
        remote = self._remotes.get(url)
        if remote is None:
            remote = self._remotes[url] = RemoteNode(url, self._secret)
        return remote

    def _serving(self) -> list[NodeState]:
        """The nodes that take new claims and changes of templates and pools."""
        return self.watcher.serving()

    def _answering(self) -> list[NodeState]:
        """The nodes that answer for the sandboxes they have."""
        return [node for node in self.watcher.view.values() if node.status in SERVING and node.url is not None]

    async def _on_each(self, call: Callable[[RemoteNode], Awaitable[T]], nodes: list[NodeState]) -> list[T]:
        """`call` on each of `nodes` at once; a node that fails to answer, or stops answering, is left out (and
        logged)."""
        answers = await asyncio.gather(*(self.watcher.answering(node.name, call(self._remote(node.url)))
                                         for node in nodes), return_exceptions=True)
        kept = []
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, httpx.TransportError | NodeUnavailable):
                throttled(log, logging.WARNING, "node %s did not answer: %s", node.name, answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                kept.append(answer)
        return kept

    # -- a sandbox's node -----------------------------------------------------------------------

    async def _at(self, sandbox_id: str, call: Callable[[RemoteNode], Awaitable[T]]) -> T:
        """`call` on the node that serves `sandbox_id`. A connection refused (nothing was sent) waits for the node
        agent to serve again (RESTART_WAIT after it stopped answering at most) and tries once more; a node down for
        longer answers 503 at once; a connection that breaks mid-call answers 503."""
        name = sandbox_id.rpartition("-")[0]
        node = self.watcher.view.get(name)
        if node is None:
            if self.watcher.unnamed:
                raise NodeUnavailable(f"sandbox {sandbox_id!r} is on no node this router knows, and "
                                      f"{self.watcher.unnamed} node agents have not answered it yet: it may be on "
                                      "one of them; try again shortly")
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
        if node.status not in SERVING or node.url is None:
            if node.status == "lost":
                raise lost(node)
            if node.down():
                raise down(name)
            node = await self.watcher.wait_serving(name)
        try:
            return await call(self._remote(node.url))
        except (httpx.ConnectError, httpx.ConnectTimeout):
            node = await self.watcher.wait_serving(name, failed=time.monotonic())
        except httpx.TransportError as error:
            raise NodeUnavailable(f"node {name} stopped answering during the call ({error}): the sandbox's state is "
                                  "unknown; check it, or try again") from None
        try:
            return await call(self._remote(node.url))
        except httpx.TransportError as error:
            raise NodeUnavailable(f"node {name} does not answer ({error}); try again shortly") from None

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, tenant: str, request: ClaimRequest, *, warm_only: bool = False, retry: bool = False
                    ) -> SandboxInfo:
        """Placed by the router (cluster/claims.py): `warm_only` is for a node's own claims, behind an edge."""
        return await self._claims.claim(tenant, request, retry)

    async def answered(self, tenant: str, sandbox_id: str, taken: bool, attempt: str | None = None) -> None:
        """The node counted its answer as taken by this router; one whose own caller was gone is withdrawn there."""
        self._claims.answered(sandbox_id, taken)

    async def withdraw(self, attempts: list[str]) -> None:
        raise InvalidRequest("withdrawals are a node agent's: a router sends them, and takes none")

    async def claims(self, tenant: str, request_key: str | None = None) -> list[SandboxInfo]:
        if request_key is not None:
            made = await self._claims.made(tenant, request_key)
            return [] if made is None else [made]
        return [info for infos in await self._on_each(lambda node: node.claims(tenant), self._answering())
                for info in infos]

    async def get(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return await self._at(sandbox_id, lambda node: node.get(tenant, sandbox_id))

    async def delete(self, tenant: str, sandbox_id: str) -> None:
        await self._at(sandbox_id, lambda node: node.delete(tenant, sandbox_id))

    async def exec(self, tenant: str, sandbox_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult:
        return await self._at(sandbox_id, lambda node: node.exec(tenant, sandbox_id, request, on_stdout, on_stderr))

    async def files(self, tenant: str, sandbox_id: str, op: FileOp, path: str, **options: Any) -> Any:
        return await self._at(sandbox_id, lambda node: node.files(tenant, sandbox_id, op, path, **options))

    async def forward(self, tenant: str, sandbox_id: str, method: str, target: str, body: bytes,
                      content_type: str | None, wait: float | None) -> tuple[int, bytes]:
        """A call on the sandbox passed to its node as bytes, and the node's answer (see forwarding.py)."""
        return await self._at(sandbox_id, lambda node: node.forward(tenant, method, target, body, content_type, wait))

    async def reset(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return await self._at(sandbox_id, lambda node: node.reset(tenant, sandbox_id))

    async def fork(self, tenant: str, sandbox_id: str, count: int) -> list[SandboxInfo]:
        """The children live on the parent's node: a fork shares its layers there."""
        return await self._at(sandbox_id, lambda node: node.fork(tenant, sandbox_id, count))

    async def pause(self, tenant: str, sandbox_id: str, memory: bool = True) -> SandboxInfo:
        return await self._at(sandbox_id, lambda node: node.pause(tenant, sandbox_id, memory))

    async def resume(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return await self._at(sandbox_id, lambda node: node.resume(tenant, sandbox_id))

    async def stats(self, tenant: str, sandbox_id: str) -> SandboxStats:
        return await self._at(sandbox_id, lambda node: node.stats(tenant, sandbox_id))

    async def model_calls(self, tenant: str, sandbox_id: str, offset: int = 0) -> ModelCallLog:
        return await self._at(sandbox_id, lambda node: node.model_calls(tenant, sandbox_id, offset))

    async def set_shutdown_after(self, tenant: str, sandbox_id: str, seconds: float) -> SandboxInfo:
        return await self._at(sandbox_id, lambda node: node.set_shutdown_after(tenant, sandbox_id, seconds))

    async def set_network(self, tenant: str, sandbox_id: str, network: Network) -> SandboxInfo:
        return await self._at(sandbox_id, lambda node: node.set_network(tenant, sandbox_id, network))

    # -- leases (on the nodes that hold claims under them: docs/faults.md) ----------------------

    async def renew_lease(self, tenant: str, lease_id: str, ttl: float) -> LeaseInfo:
        held = await self._on_each(lambda node: node.renew_lease(tenant, lease_id, ttl), self._answering())
        return LeaseInfo(id=lease_id, ttl=ttl, expires_at=time.time() + ttl,
                         sandboxes=sum(info.sandboxes for info in held))

    async def close_lease(self, tenant: str, lease_id: str) -> None:
        await self._on_each(lambda node: node.close_lease(tenant, lease_id), self._answering())

    # -- ports ------------------------------------------------------------------------------

    async def open_port(self, tenant: str, sandbox_id: str, port: int) -> PortStream:
        """A tunnel to the port through the sandbox's node agent (tunnel.py)."""
        return await self._at(sandbox_id, lambda node: open_tunnel(node.url, self._secret, tenant, sandbox_id, port))

    # -- snapshots --------------------------------------------------------------------------

    async def snapshot(self, tenant: str, sandbox_id: str, name: str) -> SnapshotInfo:
        return await self._at(sandbox_id, lambda node: node.snapshot(tenant, sandbox_id, name))

    async def snapshots(self, tenant: str) -> list[SnapshotInfo]:
        return [info for infos in await self._on_each(lambda node: node.snapshots(tenant),
                                                                         self._answering()) for info in infos]

    async def delete_snapshot(self, tenant: str, name: str) -> None:
        holding = await self._claims.holding_snapshot(tenant, name, self._answering())
        await asyncio.gather(*(self._remote(node.url).delete_snapshot(tenant, name) for node in holding))

    # -- volumes (each lives on one node: rollbox.cluster.volumes) -------------------------------

    async def create_volume(self, tenant: str, request: VolumeRequest) -> VolumeInfo:
        return await self._volumes.create(tenant, request, self._serving())

    async def volumes(self, tenant: str) -> list[VolumeInfo]:
        return await self._volumes.list(tenant)

    async def volume(self, tenant: str, name: str) -> VolumeInfo:
        return await self._volumes.get(tenant, name)

    async def delete_volume(self, tenant: str, name: str) -> None:
        await self._volumes.delete(tenant, name)

    # -- resources --------------------------------------------------------------------------

    async def apply(self, resource: Resource, progress: Callable[[str], None], tenant: str | None = None
                    ) -> ApplyStatus:
        """A template is built on every node (progress is the first node's); a warm pool is split over them."""
        nodes = self._answering()
        if not nodes:
            raise NodeUnavailable("no node of the cluster serves now: start node agents first")
        if isinstance(resource, SandboxTemplate):
            told = [progress, *[no_progress] * (len(nodes) - 1)]  # the same build, told once
            with _answered("the template's build"):
                statuses = await asyncio.gather(*(self._remote(node.url).apply(resource, say, tenant)
                                                  for node, say in zip(nodes, told, strict=True)))
            return "created" if "created" in statuses else "configured" if "configured" in statuses else "unchanged"
        before = read_pools(self.watcher.view.values()).get(resource.metadata.name)
        pool = ClusterPool.applied(resource)
        if before is not None and before.same_as(pool):
            return "unchanged"
        await self._check_template(pool.template, nodes)
        await self.watcher.place({**read_pools(self.watcher.view.values()), pool.name: pool}, self._serving())
        await self.watcher.look()
        return "created" if before is None else "configured"

    async def _check_template(self, name: str, nodes: list[NodeState]) -> None:
        with _answered("the template's check"):
            templates = await self._remote(nodes[0].url).templates()
        if not any(template.name == name for template in templates):
            raise TemplateNotFound(f"template {name!r} is not built: apply it first")

    async def templates(self) -> list[TemplateInfo]:
        return await self._first(lambda node: node.templates())

    async def template(self, name: str) -> TemplateInfo:
        return await self._first(lambda node: node.template(name))

    async def delete_template(self, name: str) -> None:
        await self._on_each(lambda node: node.delete_template(name), self._answering())

    async def warmpools(self) -> list[WarmPoolInfo]:
        pools = read_pools(self.watcher.view.values())
        return [self._pool_info(pool) for _, pool in sorted(pools.items())]

    async def warmpool(self, name: str) -> WarmPoolInfo:
        pool = read_pools(self.watcher.view.values()).get(name)
        if pool is None:
            raise await self._first(lambda node: node.warmpool(name))  # the node's own 404
        return self._pool_info(pool)

    def _pool_info(self, pool: ClusterPool) -> WarmPoolInfo:
        held = [node.pools[pool.name] for node in self._answering() if pool.name in node.pools]
        return WarmPoolInfo(name=pool.name, template=pool.template, replicas=pool.replicas,
                            max_replicas=pool.max_replicas, target=sum(h.get("replicas", 0) for h in held),
                            ready=sum(h.get("ready", 0) for h in held),
                            starting=sum(h.get("starting", 0) for h in held),
                            labels=pool.labels, refill_concurrency=pool.refill_concurrency)

    async def delete_warmpool(self, name: str) -> None:
        await self.warmpool(name)
        await self._on_each(lambda node: node.delete_warmpool(name), self._answering())
        await self.watcher.look()

    async def _first(self, call: Callable[[RemoteNode], Awaitable[T]]) -> T:
        nodes = self._answering()
        if not nodes:
            raise NodeUnavailable("no node of the cluster serves now: start node agents first")
        with _answered(f"a call on node {nodes[0].name}"):
            return await call(self._remote(nodes[0].url))

    # -- operations -------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        view = self.watcher.view
        serving = self._answering()
        pools = {name: {"template": info.template, "replicas": info.replicas, "ready": info.ready,
                        "starting": info.starting}
                 for name, info in ((name, self._pool_info(pool))
                                    for name, pool in read_pools(view.values()).items())}
        return {"sandboxes": sum(node.sandboxes for node in serving),
                "max_sandboxes": sum(node.max_sandboxes for node in serving),
                "claims": sum(node.claims for node in serving), "pools": pools,
                "nodes": {name: node.describe() for name, node in sorted(view.items())},
                "data_plane": self.data_plane}


@contextlib.contextmanager
def _answered(what: str) -> Iterator[None]:
    """A node that stops answering during `what` (it is leaving, or its agent restarts) answers 503, to be tried
    again, not a server failure."""
    try:
        yield
    except httpx.TransportError as error:
        raise NodeUnavailable(f"a node stopped answering during {what} ({error}); try again shortly") from None
