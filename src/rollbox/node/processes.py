"""The `Node` interface's process operations on this machine: background processes, terminals and shell sessions
of a tenant's sandboxes, through the engine (`rollbox.engine.processes`).

Processes live in the sandbox's container, so they die with it: a reset hands the sandbox a fresh container
and a delete removes it. A call on a process counts as a call on its sandbox (it is not idle, and an
idle-paused sandbox wakes first); so does following a process's output, for as long as the stream lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from anyio import to_thread

from rollbox.engine.processes import ContainerProcesses
from rollbox.errors import SandboxNotRunning
from rollbox.models import (
    ExecResult,
    ProcessControl,
    ProcessEvent,
    ProcessInfo,
    ProcessRequest,
    ShellCommand,
    ShellRequest,
)
from rollbox.node.claims import Claim, as_sandbox

if TYPE_CHECKING:
    import threading

    from rollbox.engine import Engine

_shell_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()
"""One command at a time per shell session, by (container id, process id)."""


class ProcessOperations:
    """`LocalNode`'s process operations (a mixin: it uses the node's claims, lock and engine)."""

    engine: Engine
    lock: threading.Lock

    def _get(self, tenant: str, sandbox_id: str) -> Claim: ...  # LocalNode's
    def _wake(self, claim: Claim) -> None: ...  # LocalNode's

    @contextlib.asynccontextmanager
    async def _processes_of(self, tenant: str, sandbox_id: str) -> AsyncIterator[tuple[Claim, ContainerProcesses]]:
        """The claim's container's processes, with the claim marked in use (and woken if idle-paused)."""
        claim = self._get(tenant, sandbox_id)
        if claim.paused == "user":
            raise SandboxNotRunning(f"sandbox {sandbox_id} is paused: resume it before using its processes")
        with self.lock:
            claim.busy += 1
            idle = claim.paused == "idle"
        try:
            if idle:
                await to_thread.run_sync(self._wake, claim)
            with as_sandbox(claim):
                yield claim, self.engine.processes(claim.container_id)
        finally:
            with self.lock:
                claim.busy -= 1
                claim.last_used = time.monotonic()

    async def start_process(self, tenant: str, sandbox_id: str, request: ProcessRequest) -> ProcessInfo:
        async with self._processes_of(tenant, sandbox_id) as (claim, processes):
            return await processes.start(request, env=_env(claim, request.env))

    async def processes(self, tenant: str, sandbox_id: str) -> list[ProcessInfo]:
        async with self._processes_of(tenant, sandbox_id) as (_, processes):
            return await processes.list()

    async def process(self, tenant: str, sandbox_id: str, process_id: str) -> ProcessInfo:
        async with self._processes_of(tenant, sandbox_id) as (_, processes):
            return await processes.get(process_id)

    async def process_events(self, tenant: str, sandbox_id: str, process_id: str, offset: int | None = 0
                             ) -> AsyncIterator[ProcessEvent]:
        async with self._processes_of(tenant, sandbox_id) as (_, processes):
            events = processes.events(process_id, offset)
            try:
                async for event in events:
                    yield event
            finally:
                await events.aclose()

    async def control_process(self, tenant: str, sandbox_id: str, process_id: str, request: ProcessControl) -> None:
        async with self._processes_of(tenant, sandbox_id) as (_, processes):
            await processes.control(process_id, request)

    async def delete_process(self, tenant: str, sandbox_id: str, process_id: str) -> None:
        async with self._processes_of(tenant, sandbox_id) as (_, processes):
            await processes.delete(process_id)

    async def start_shell(self, tenant: str, sandbox_id: str, request: ShellRequest) -> ProcessInfo:
        async with self._processes_of(tenant, sandbox_id) as (claim, processes):
            return await processes.start_shell(env=_env(claim, request.env), cwd=request.cwd, user=request.user,
                                               shell=request.shell)

    async def run_in_shell(self, tenant: str, sandbox_id: str, process_id: str, request: ShellCommand) -> ExecResult:
        async with self._processes_of(tenant, sandbox_id) as (claim, processes):
            key = (claim.container_id, process_id)
            lock = _shell_locks.get(key)
            if lock is None:
                lock = _shell_locks[key] = asyncio.Lock()
            async with lock:
                return await processes.run_in_shell(process_id, request)


def _env(claim: Claim, env: dict[str, str] | None) -> dict[str, str] | None:
    """The claim's environment under the request's (as for `exec`)."""
    return {**claim.env, **env} if claim.env and env else (env or claim.env)
