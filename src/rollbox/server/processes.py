"""Routes of a sandbox's background processes (`/v1/sandboxes/{sandbox_id}/processes`) and shell sessions
(`/v1/sandboxes/{sandbox_id}/shells`); docs/processes.md."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import Response, StreamingResponse

from rollbox.errors import InvalidRequest
from rollbox.models import (
    ExecResult,
    ProcessControl,
    ProcessEvent,
    ProcessInfo,
    ProcessRequest,
    ShellCommand,
    ShellRequest,
)
from rollbox.node import Node
from rollbox.server.responses import json_response, no_content
from rollbox.server.routing import Query, Routes
from rollbox.server.streams import as_rollbox_error

PROCESSES = "/v1/sandboxes/{sandbox_id}/processes"
PROCESS = PROCESSES + "/{process_id}"


def add_routes(routes: Routes, node: Node) -> None:
    add = routes.add

    @add("POST", PROCESSES, body=ProcessRequest, answer=ProcessInfo, status=201)
    async def start_process(tenant: str, sandbox_id: str, body: ProcessRequest) -> Response:
        """Starts a background process: it runs until it ends or is killed, or its sandbox is reset or deleted."""
        return json_response(await node.start_process(tenant, sandbox_id, body), 201)

    @add("GET", PROCESSES, answer=list[ProcessInfo])
    async def list_processes(tenant: str, sandbox_id: str) -> Response:
        """The sandbox's background processes, running or ended (ended ones are kept to be read back)."""
        return json_response(await node.processes(tenant, sandbox_id))

    @add("GET", PROCESS, answer=ProcessInfo)
    async def get_process(tenant: str, sandbox_id: str, process_id: str) -> Response:
        """Describes one background process."""
        return json_response(await node.process(tenant, sandbox_id, process_id))

    @add("GET", PROCESS + "/events", answer="application/x-ndjson", query=(Query("offset", str, "0"),))
    async def process_events(tenant: str, sandbox_id: str, process_id: str, offset: str) -> Response:
        """Streams the process's output from byte `offset` of what is kept (`now`: from now): one ProcessEvent
        per line, `start` first and `end` last."""
        return await _stream(node.process_events(tenant, sandbox_id, process_id, _offset(offset)))

    @add("POST", PROCESS + "/control", body=ProcessControl, status=204)
    async def control_process(tenant: str, sandbox_id: str, process_id: str, body: ProcessControl) -> Response:
        """Writes stdin, closes it, resizes the terminal, sends a signal (each optional, in that order)."""
        await node.control_process(tenant, sandbox_id, process_id, body)
        return no_content()

    @add("DELETE", PROCESS, status=204)
    async def delete_process(tenant: str, sandbox_id: str, process_id: str) -> Response:
        """Kills the process and everything it started, and forgets it."""
        await node.delete_process(tenant, sandbox_id, process_id)
        return no_content()

    @add("POST", "/v1/sandboxes/{sandbox_id}/shells", body=ShellRequest, answer=ProcessInfo, status=201)
    async def start_shell(tenant: str, sandbox_id: str, body: ShellRequest) -> Response:
        """Starts a shell session: a background process whose directory and variables carry between commands."""
        return json_response(await node.start_shell(tenant, sandbox_id, body), 201)

    @add("POST", "/v1/sandboxes/{sandbox_id}/shells/{process_id}/run", body=ShellCommand, answer=ExecResult)
    async def run_in_shell(tenant: str, sandbox_id: str, process_id: str, body: ShellCommand) -> Response:
        """Runs one command in a shell session; its timeout interrupts the command, not the session."""
        return json_response(await node.run_in_shell(tenant, sandbox_id, process_id, body))


def _offset(text: str) -> int | None:
    if text == "now":
        return None
    if not text.isdigit():
        raise InvalidRequest(f"offset={text!r}: give a byte offset (0: from the start of what is kept) or 'now'")
    return int(text)


async def _stream(events: AsyncIterator[ProcessEvent]) -> Response:
    """NDJSON of `events`, read only as fast as the client takes them: a client that stops reading leaves the
    output in the sandbox. A failure before the first event is a plain error answer; a later one the last line."""
    try:
        first = await anext(events)
    except BaseException:
        await events.aclose()  # type: ignore[attr-defined]
        raise

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield _line(first)
            async for event in events:
                yield _line(event)
        except Exception as error:
            failure = as_rollbox_error(error)
            yield _line(ProcessEvent(type="error", code=failure.code, message=str(failure)))
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _line(event: ProcessEvent) -> bytes:
    return event.model_dump_json().encode() + b"\n"
