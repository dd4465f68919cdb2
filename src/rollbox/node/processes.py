"""The `Node` interface's process operations on this machine: background processes, terminals and shell sessions
of a tenant's sandboxes, through the engine (`rollbox.engine.processes`).

Processes live in the sandbox's container, so they die with it: a reset hands the sandbox a fresh container
and a delete removes it. A call on a process counts as a call on its sandbox (it is not idle, and an
idle-paused sandbox wakes first); so does following a process's output, for as long as the stream lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from rollbox.engine.processes import ContainerProcesses
from rollbox.models import (
    ExecResult,
    ProcessControl,
    ProcessEvent,
    ProcessInfo,
    ProcessRequest,
    ShellCommand,
    ShellRequest,
)
from rollbox.node.claims import Claim, environment

if TYPE_CHECKING:
    from rollbox.engine import Engine
    from rollbox.node.held import HeldClaims

_shell_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()
"""One command at a time per shell session, by (container id, process id)."""


class ProcessOperations:
    """`LocalNode`'s process operations (a mixin: it uses the node's claims and engine)."""

    engine: Engine
    held: HeldClaims

    @contextlib.asynccontextmanager
    async def _processes_of(self, tenant: str, sandbox_id: str) -> AsyncIterator[tuple[Claim, ContainerProcesses]]:
        """The claim's container's processes, with the claim in use as for `exec`."""
        async with self.held.calling(tenant, sandbox_id, "using its processes") as claim:
            yield claim, self.engine.processes(claim.container_id)

    async def start_process(self, tenant: str, sandbox_id: str, request: ProcessRequest) -> ProcessInfo:
        async with self._processes_of(tenant, sandbox_id) as (claim, processes):
            return await processes.start(request, env=environment(claim, request.env))

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
            return await processes.start_shell(env=environment(claim, request.env), cwd=request.cwd, user=request.user,
                                               shell=request.shell)

    async def run_in_shell(self, tenant: str, sandbox_id: str, process_id: str, request: ShellCommand) -> ExecResult:
        async with self._processes_of(tenant, sandbox_id) as (claim, processes):
            key = (claim.container_id, process_id)
            lock = _shell_locks.get(key)
            if lock is None:
                lock = _shell_locks[key] = asyncio.Lock()
            async with lock:
                return await processes.run_in_shell(process_id, request)
