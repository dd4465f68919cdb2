"""Chaos for a cluster on this machine (tests/support/cluster.py): clients claiming under load while its processes are
killed, frozen and started again, and the counts that say whether anything leaked, was lost or stalled.

`Load` runs `clients` asyncio SDK clients in a thread of their own. Each, in turn, claims a sandbox from a warm pool,
writes a mark into it, reads the mark back with `cat`, holds it a moment and deletes it. A call that fails because a
node is away leaves the sandbox `unsure`: `settle` reads its mark back once the node is back (a lost sandbox is one
whose mark did not read back exactly) and deletes it, or forgets it if its node is gone for good. Afterwards the
nodes are asked, with the cluster secret, what they still hold for the tenant: what a client does not know of is
orphaned. `tracebacks` counts tracebacks in every log. tests/cluster/test_cluster_chaos.py and bench/cluster_faults.py
drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rollbox import errors
from rollbox.client import AsyncSandboxClient
from rollbox.server.auth import TENANT_HEADER
from tests.support.cluster import Cluster, Process, node_of

SETTLE_TIMEOUT = 60.0
"""Seconds `settle` waits for a node that is away to answer for an unsure sandbox."""


def resources(name: str, replicas: int = 12) -> str:
    """A template on the host's base and its warm pool, both `name`: what the clients claim."""
    return f"""\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {{name: {name}}}
spec: {{base: host}}
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {{name: {name}}}
spec: {{replicas: {replicas}, refillConcurrency: 4, sandboxTemplateRef: {{name: {name}}}}}
"""


@dataclass(frozen=True)
class Claimed:
    """One claim as a client saw it: when it was asked (monotonic), how long it took, and where it landed (or the
    error's code)."""

    started: float
    seconds: float
    sandbox_id: str | None
    error: str | None = None

    @property
    def node(self) -> str | None:
        return None if self.sandbox_id is None else node_of(self.sandbox_id)


@dataclass
class Held:
    sandbox_id: str
    mark: str
    written: bool = False
    deleting: bool = False
    """Its delete was sent: if its answer was lost, the sandbox may be gone, as asked."""


@dataclass
class Load:
    url: str
    token: str
    pool: str
    clients: int = 32
    hold: float = 0.2
    claims: list[Claimed] = field(default_factory=list)
    unsure: dict[str, Held] = field(default_factory=dict)
    """Sandboxes a call on failed (their node away): checked and deleted by `settle`."""
    held: dict[str, Held] = field(default_factory=dict)
    """Sandboxes claimed and not yet deleted."""
    lost: list[str] = field(default_factory=list)
    """Sandboxes whose mark did not read back exactly (or that vanished) while their node was up."""
    errors: Counter[str] = field(default_factory=Counter)
    """Failed calls by error code, claims included."""

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),),
                                        name="chaos-load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops claiming; every client deletes what it holds (what it cannot stays unsure)."""
        self._stopping.set()
        self._thread.join(300)
        assert not self._thread.is_alive(), "the clients did not stop"

    def between(self, start: float, end: float) -> list[Claimed]:
        return [claim for claim in self.claims if start <= claim.started < end]

    async def _run(self) -> None:
        self._client = AsyncSandboxClient(self.url, token=self.token, max_connections=self.clients * 2)
        try:
            await asyncio.gather(*(self._cycle() for _ in range(self.clients)))
        finally:
            await self._client.close()

    async def _cycle(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                sandbox = await self._client.create_sandbox(warmpool=self.pool)
            except Exception as error:
                self.claims.append(Claimed(started, time.monotonic() - started, None, _code(error)))
                self.errors[_code(error)] += 1
                await asyncio.sleep(0.1)
                continue
            self.claims.append(Claimed(started, time.monotonic() - started, sandbox.id))
            held = self.held[sandbox.id] = Held(sandbox.id, secrets.token_hex(8))
            try:
                await sandbox.files.write("mark", held.mark)
                held.written = True
                read = await sandbox.run("cat mark")
                if read.stdout != held.mark:
                    self.lost.append(sandbox.id)
                await asyncio.sleep(self.hold)
                held.deleting = True
                await sandbox.delete()
                del self.held[sandbox.id]
            except Exception as error:
                self.errors[_code(error)] += 1
                self.unsure[sandbox.id] = self.held.pop(sandbox.id)

    def settle(self, gone: Iterable[str] = ()) -> None:
        """Reads back and deletes each unsure sandbox once its node answers (those of nodes `gone` for good are
        forgotten): a mark that does not read back exactly, or a sandbox not found, is lost."""
        gone = set(gone)

        async def one(client: AsyncSandboxClient, held: Held) -> None:
            deadline = time.monotonic() + SETTLE_TIMEOUT
            while True:
                try:
                    sandbox = await client.get_sandbox(held.sandbox_id)
                    if held.written and (await sandbox.files.read_text("mark")) != held.mark:
                        self.lost.append(held.sandbox_id)
                    await sandbox.delete()
                    return
                except errors.SandboxNotFound:
                    if not held.deleting:
                        self.lost.append(held.sandbox_id)
                    return
                except errors.RollboxError:
                    assert time.monotonic() < deadline, f"{held.sandbox_id}: its node never answered again"
                    await asyncio.sleep(0.5)

        async def every() -> None:
            async with AsyncSandboxClient(self.url, token=self.token) as client:
                await asyncio.gather(*(one(client, held) for held in self.unsure.values()
                                       if node_of(held.sandbox_id) not in gone))

        asyncio.run(every())
        self.unsure.clear()


def freeze(process: Process, seconds: float) -> float:
    """Stops `process` (SIGSTOP) for `seconds`, then lets it go on; when it stopped (monotonic)."""
    assert process.process is not None
    stopped = time.monotonic()
    os.kill(process.process.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(process.process.pid, signal.SIGCONT)
    return stopped


def _code(error: Exception) -> str:
    """A rollbox error's code; anything else (a bug) by its type, which a test then shows."""
    return error.code if isinstance(error, errors.RollboxError) else type(error).__name__


def orphans(cluster: Cluster, tenant: str, gone: Iterable[str] = ()) -> list[str]:
    """The sandboxes each node that is not gone holds for `tenant`, asked of its agent with the cluster secret."""
    secret = cluster.secret_file.read_text().strip()
    found = []
    for name, node in cluster.nodes.items():
        if name in set(gone):
            continue
        answer = httpx.get(f"{node.url}/v1/sandboxes", timeout=30,
                           headers={"Authorization": f"Bearer {secret}", TENANT_HEADER: tenant})
        answer.raise_for_status()
        found += [f"{info['id']} (made at {info['created_at']:.2f})" for info in answer.json()]
    return found


def tracebacks(logs: Iterable[Path]) -> dict[str, int]:
    """Tracebacks in each log (by file name), and the first of them, for the assertion's message."""
    counts = {}
    for log in logs:
        with contextlib.suppress(OSError):
            counts[log.name] = log.read_text(errors="replace").count("Traceback (most recent call last)")
    return counts


def first_traceback(logs: Iterable[Path]) -> str:
    for log in logs:
        text = log.read_text(errors="replace") if log.exists() else ""
        at = text.find("Traceback (most recent call last)")
        if at >= 0:
            return f"{log.name}:\n{text[max(0, at - 300):at + 3000]}"
    return ""
