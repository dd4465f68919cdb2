"""The calls on background processes, terminals and shell sessions (docs/processes.md), and the reading of a
process's event stream: described once here for the SDK's handles (`_process_handles`) and for a router's
calls to its node agents.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypedDict

from pydantic import TypeAdapter

from rollbox import errors
from rollbox.client._call import JSON, Call, _body, _delete, _dump, _get, _json, _name, _none, _post
from rollbox.client._calls import _sandbox
from rollbox.client._exchange import Exchange
from rollbox.client._http import Answer, error_from
from rollbox.client._options import Command, OutputCallback
from rollbox.models import (
    ExecResult,
    ProcessControl,
    ProcessEvent,
    ProcessInfo,
    ProcessRequest,
    PtySize,
    ShellCommand,
    ShellRequest,
)

Pty = PtySize | tuple[int, int] | bool
"""A terminal: its size, (rows, cols), or True for 24x80."""
_PROCESS = _json(TypeAdapter(ProcessInfo))
_PROCESSES = _json(TypeAdapter(list[ProcessInfo]))
_EXEC = _json(TypeAdapter(ExecResult))
_EVENT = TypeAdapter(ProcessEvent)
SHELL_GRACE = 15.0
"""Seconds a shell command's answer may take past its timeout (the interrupt, then the kill)."""


class BackgroundOptions(TypedDict, total=False):
    """What `commands.run(..., background=True)` accepts besides the command."""

    env: dict[str, str] | None
    cwd: str | None
    user: str | None
    stdin: str | None
    """Written to its stdin as it starts; more with `send_stdin`."""
    close_stdin: bool
    pty: Pty | None
    """Run on a terminal (stdout and stderr arrive together as stdout)."""
    timeout: float | None
    """Seconds after which it and everything it started are killed."""
    output_limit: int | None
    """Bytes of output kept to be read back (the template's output limit by default)."""
    tag: str | None


# -- the calls ------------------------------------------------------------------------------------

def _processes(sandbox_id: str, tail: str = "") -> str:
    return _sandbox(sandbox_id, "/processes" + tail)


def _process(sandbox_id: str, process_id: str, tail: str = "") -> str:
    return _processes(sandbox_id, f"/{_name(process_id)}{tail}")


def start_process(sandbox_id: str, command: Command, options: BackgroundOptions) -> Call[ProcessInfo]:
    fields: dict[str, Any] = dict(options)
    pty = fields.pop("pty", None)
    if pty is True:
        fields["pty"] = {}
    elif isinstance(pty, tuple):
        fields["pty"] = {"rows": pty[0], "cols": pty[1]}
    elif pty:
        fields["pty"] = pty
    return process_started(sandbox_id, _body(ProcessRequest, command=command, **fields))


def process_started(sandbox_id: str, request: ProcessRequest) -> Call[ProcessInfo]:
    """The call that starts `request` in the background (a router's to its node agent sends the one it took)."""
    return Call("POST", _processes(sandbox_id), _PROCESS, body=_dump(request), headers=JSON)


def list_processes(sandbox_id: str) -> Call[list[ProcessInfo]]:
    return _get(_processes(sandbox_id), _PROCESSES)


def get_process(sandbox_id: str, process_id: str) -> Call[ProcessInfo]:
    return _get(_process(sandbox_id, process_id), _PROCESS)


def control_process(sandbox_id: str, process_id: str, **fields: Any) -> Call[None]:
    return _post(_process(sandbox_id, process_id, "/control"), _none, _body(ProcessControl, **fields))


def delete_process(sandbox_id: str, process_id: str) -> Call[None]:
    return _delete(_process(sandbox_id, process_id))


def start_shell(sandbox_id: str, **fields: Any) -> Call[ProcessInfo]:
    return _post(_sandbox(sandbox_id, "/shells"), _PROCESS, _body(ShellRequest, **fields))


def run_in_shell(sandbox_id: str, process_id: str, command: str, timeout: float | None,
                 output_limit: int | None) -> Call[ExecResult]:
    body = _body(ShellCommand, command=command, timeout=timeout, output_limit=output_limit)
    return Call("POST", _sandbox(sandbox_id, f"/shells/{_name(process_id)}/run"), _EXEC, body=_dump(body),
                headers=JSON, wait=None if timeout is None else timeout + SHELL_GRACE)


def events_target(sandbox_id: str, process_id: str, offset: int | None) -> tuple[str, dict[str, str]]:
    """The path and query of a process's event stream from `offset` (None: from now)."""
    return _process(sandbox_id, process_id, "/events"), {"offset": "now" if offset is None else str(offset)}


def parse_event(line: str) -> ProcessEvent | None:
    """One NDJSON line as an event; an `error` event raises its error."""
    if not line:
        return None
    event = _EVENT.validate_json(line)
    if event.type == "error":
        raise errors.from_code(event.code or "internal", event.message or "the process's stream failed")
    return event


class Collector:
    """Events read into a result, with the output callbacks called as output comes."""

    def __init__(self, on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self.dropped = False
        self.result: ExecResult | None = None

    def feed(self, event: ProcessEvent) -> ExecResult | None:
        if event.type in ("stdout", "stderr"):
            (self.out if event.type == "stdout" else self.err).append(event.data)
            callback = self.callbacks[event.type]
            if callback:
                callback(event.data)
        elif event.type == "gap" or (event.type == "start" and event.offset):
            self.dropped = True
        elif event.type == "end" and event.result:
            self.result = event.result.model_copy(update={
                "stdout": "".join(self.out), "stderr": "".join(self.err),
                "stdout_truncated": event.result.stdout_truncated or self.dropped,
                "stderr_truncated": event.result.stderr_truncated or self.dropped})
        return self.result

    def done(self, process_id: str) -> ExecResult:
        if self.result is None:
            raise errors.NodeUnavailable(f"process {process_id}: its stream stopped before it ended; the server or "
                                         "the sandbox's node went away")
        return self.result


async def stream_events(exchange: Exchange, sandbox_id: str, process_id: str, offset: int | None,
                        headers: dict[str, str] | None = None) -> AsyncIterator[ProcessEvent]:
    """A process's events over an `Exchange` (the asyncio SDK's, and a router's to its node agents)."""
    path, params = events_target(sandbox_id, process_id, offset)
    settings = exchange.settings
    request = settings.written("GET", path, params=params, headers=headers)
    reply = await exchange.transport.send(request, settings.timeouts(None))
    try:
        if not reply.is_success:
            raise error_from(Answer("GET", settings.target(path), reply.status_code, reply.reason_phrase,
                                    await reply.read()))
        async for line in reply.lines():
            event = parse_event(line)
            if event is not None:
                yield event
    finally:
        reply.close()
