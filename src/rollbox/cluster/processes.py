"""The calls on a sandbox's background processes and shell sessions (docs/processes.md), each sent to the node that
serves the sandbox; a mixin of `ClusterNode`, whose `_at` finds that node."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import httpx

from rollbox.cluster.remote import RemoteNode
from rollbox.errors import NodeUnavailable
from rollbox.models import (
    ExecResult,
    ProcessControl,
    ProcessEvent,
    ProcessInfo,
    ProcessRequest,
    ShellCommand,
    ShellRequest,
)

T = TypeVar("T")


class ClusterProcesses:
    _at: Callable[[str, Callable[[RemoteNode], Awaitable[T]]], Awaitable[T]]

    async def start_process(self, tenant: str, sandbox_id: str, request: ProcessRequest) -> ProcessInfo:
        return await self._at(sandbox_id, lambda node: node.start_process(tenant, sandbox_id, request))

    async def processes(self, tenant: str, sandbox_id: str) -> list[ProcessInfo]:
        return await self._at(sandbox_id, lambda node: node.processes(tenant, sandbox_id))

    async def process(self, tenant: str, sandbox_id: str, process_id: str) -> ProcessInfo:
        return await self._at(sandbox_id, lambda node: node.process(tenant, sandbox_id, process_id))

    async def process_events(self, tenant: str, sandbox_id: str, process_id: str, offset: int | None = 0
                             ) -> AsyncIterator[ProcessEvent]:
        """The node's stream, passed through as it comes; opening it is a call like any other (`_at`)."""

        async def opened(node: RemoteNode) -> tuple[ProcessEvent, AsyncIterator[ProcessEvent]]:
            events = node.process_events(tenant, sandbox_id, process_id, offset)
            try:
                return await anext(events), events
            except BaseException:
                await events.aclose()  # type: ignore[attr-defined]
                raise

        first, events = await self._at(sandbox_id, opened)
        try:
            yield first
            async for event in events:
                yield event
        except httpx.TransportError as error:
            raise NodeUnavailable(f"the sandbox's node stopped answering during the stream ({error}); follow the "
                                  "process again from the last offset") from None
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    async def control_process(self, tenant: str, sandbox_id: str, process_id: str, request: ProcessControl
                              ) -> None:
        await self._at(sandbox_id, lambda node: node.control_process(tenant, sandbox_id, process_id, request))

    async def delete_process(self, tenant: str, sandbox_id: str, process_id: str) -> None:
        await self._at(sandbox_id, lambda node: node.delete_process(tenant, sandbox_id, process_id))

    async def start_shell(self, tenant: str, sandbox_id: str, request: ShellRequest) -> ProcessInfo:
        return await self._at(sandbox_id, lambda node: node.start_shell(tenant, sandbox_id, request))

    async def run_in_shell(self, tenant: str, sandbox_id: str, process_id: str, request: ShellCommand
                           ) -> ExecResult:
        return await self._at(sandbox_id, lambda node: node.run_in_shell(tenant, sandbox_id, process_id, request))
