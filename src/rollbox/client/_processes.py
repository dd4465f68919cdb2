"""Background processes, terminals and shell sessions in the SDK (docs/processes.md).

`commands.run(cmd, background=True)` returns a handle on a process that keeps running between calls: wait for
it, stream its output (again, from any offset, after a reconnect), send it stdin and signals, resize its
terminal. `commands.list()` and `commands.connect(id)` find processes again; `sandbox.shell()` is a session
whose directory and variables carry from one command to the next. The calls are described once here; the
blocking and asyncio classes only move the bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

import httpx
from pydantic import TypeAdapter

from rollbox import errors
from rollbox.client._calls import JSON, Call, _body, _delete, _dump, _get, _json, _name, _none, _post, _sandbox
from rollbox.client._http import Answer, connection_failed, error_from
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

if TYPE_CHECKING:
    from rollbox.client._exchange import Exchange
    from rollbox.client.aio import AsyncSandboxClient
    from rollbox.client.sync import SandboxClient

C = TypeVar("C")
"""The client a handle calls through: `SandboxClient` or `AsyncSandboxClient`."""
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


# -- blocking -------------------------------------------------------------------------------------

class _Handle(Generic[C]):
    """What both clients' handles hold: their client, the sandbox, and what the router last said."""

    def __init__(self, client: C, sandbox_id: str, info: ProcessInfo) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self.info = info
        """What the router last said about the process; `refresh()` asks again."""

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def pid(self) -> int:
        return self.info.pid

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, pid={self.pid}, command={self.info.command!r})"


class ProcessHandle(_Handle["SandboxClient"]):
    """A background process of a sandbox. Holding one costs nothing; each method is one HTTP call."""

    def refresh(self) -> ProcessInfo:
        self.info = self._client._send(get_process(self._sandbox_id, self.id))
        return self.info

    def events(self, offset: int | None = 0) -> Iterator[ProcessEvent]:
        """Its output from byte `offset` of what is kept (None: from now) as it comes, then its end."""
        path, params = events_target(self._sandbox_id, self.id, offset)
        settings = self._client._settings
        request = settings.request("GET", path, params=params, wait=None)
        try:
            with contextlib.closing(self._client._http.send(request, stream=True)) as response:
                if not response.is_success:
                    response.read()
                    raise error_from(Answer("GET", path, response.status_code, response.reason_phrase,
                                            response.content))
                for line in response.iter_lines():
                    event = parse_event(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as error:
            raise connection_failed(self._client.base_url, "GET", path, error) from error

    def wait(self, on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None) -> ExecResult:
        """Waits for it to end; the result holds its output from the start (of what is kept)."""
        collector = Collector(on_stdout, on_stderr)
        for event in self.events(0):
            if collector.feed(event):
                break
        return collector.done(self.id)

    def send_stdin(self, data: str) -> None:
        self._client._send(control_process(self._sandbox_id, self.id, stdin=data))

    def close_stdin(self) -> None:
        self._client._send(control_process(self._sandbox_id, self.id, close_stdin=True))

    def kill(self, signal: int | str = "SIGKILL") -> None:
        """Sends `signal` (a number or a name) to its process group."""
        self._client._send(control_process(self._sandbox_id, self.id, signal=signal))

    def resize(self, rows: int, cols: int) -> None:
        """Resizes its terminal."""
        self._client._send(control_process(self._sandbox_id, self.id, resize=PtySize(rows=rows, cols=cols)))

    def delete(self) -> None:
        """Kills it (and all it started) if it runs, and forgets it."""
        self._client._send(delete_process(self._sandbox_id, self.id))


class ProcessCommands:
    """`commands.list()`, `connect()`, `kill()`, `send_stdin()` (mixed into `sync.Commands`)."""

    _client: SandboxClient
    _sandbox_id: str

    def _start(self, command: Command, options: BackgroundOptions) -> ProcessHandle:
        info = self._client._send(start_process(self._sandbox_id, command, options))
        return ProcessHandle(self._client, self._sandbox_id, info)

    def list(self) -> list[ProcessInfo]:
        """The sandbox's background processes, running or ended."""
        return self._client._send(list_processes(self._sandbox_id))

    def connect(self, process_id: str) -> ProcessHandle:
        return ProcessHandle(self._client, self._sandbox_id, self._client._send(get_process(self._sandbox_id,
                                                                                            process_id)))

    def kill(self, process_id: str, signal: int | str = "SIGKILL") -> None:
        self._client._send(control_process(self._sandbox_id, process_id, signal=signal))

    def send_stdin(self, process_id: str, data: str) -> None:
        self._client._send(control_process(self._sandbox_id, process_id, stdin=data))


class Shell(_Handle["SandboxClient"]):
    """A shell session in a sandbox: its directory, environment and variables carry from command to command."""

    def run(self, command: str, *, timeout: float | None = None, output_limit: int | None = None) -> ExecResult:
        """Runs `command` in the session; `timeout` interrupts it (then kills it) and the session lives on."""
        return self._client._send(run_in_shell(self._sandbox_id, self.id, command, timeout, output_limit))

    def close(self) -> None:
        with contextlib.suppress(errors.ProcessNotFound, errors.SandboxNotFound):
            self._client._send(delete_process(self._sandbox_id, self.id))

    def __enter__(self) -> Shell:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_shell(client: SandboxClient, sandbox_id: str, **fields: Any) -> Shell:
    return Shell(client, sandbox_id, client._send(start_shell(sandbox_id, **fields)))


# -- asyncio --------------------------------------------------------------------------------------

class AsyncProcessHandle(_Handle["AsyncSandboxClient"]):
    """`ProcessHandle` with `await`."""

    async def refresh(self) -> ProcessInfo:
        self.info = await self._client._send(get_process(self._sandbox_id, self.id))
        return self.info

    async def events(self, offset: int | None = 0) -> AsyncIterator[ProcessEvent]:
        path, _ = events_target(self._sandbox_id, self.id, offset)
        try:
            async for event in stream_events(self._client._exchange, self._sandbox_id, self.id, offset):
                yield event
        except httpx.TransportError as error:
            raise connection_failed(self._client.base_url, "GET", path, error) from error

    async def wait(self, on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None
                   ) -> ExecResult:
        collector = Collector(on_stdout, on_stderr)
        events = self.events(0)
        try:
            async for event in events:
                if collector.feed(event):
                    break
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        return collector.done(self.id)

    async def send_stdin(self, data: str) -> None:
        await self._client._send(control_process(self._sandbox_id, self.id, stdin=data))

    async def close_stdin(self) -> None:
        await self._client._send(control_process(self._sandbox_id, self.id, close_stdin=True))

    async def kill(self, signal: int | str = "SIGKILL") -> None:
        await self._client._send(control_process(self._sandbox_id, self.id, signal=signal))

    async def resize(self, rows: int, cols: int) -> None:
        await self._client._send(control_process(self._sandbox_id, self.id, resize=PtySize(rows=rows, cols=cols)))

    async def delete(self) -> None:
        await self._client._send(delete_process(self._sandbox_id, self.id))


class AsyncProcessCommands:
    """`ProcessCommands` with `await` (mixed into `aio.AsyncCommands`)."""

    _client: AsyncSandboxClient
    _sandbox_id: str

    async def _start(self, command: Command, options: BackgroundOptions) -> AsyncProcessHandle:
        info = await self._client._send(start_process(self._sandbox_id, command, options))
        return AsyncProcessHandle(self._client, self._sandbox_id, info)

    async def list(self) -> list[ProcessInfo]:
        return await self._client._send(list_processes(self._sandbox_id))

    async def connect(self, process_id: str) -> AsyncProcessHandle:
        info = await self._client._send(get_process(self._sandbox_id, process_id))
        return AsyncProcessHandle(self._client, self._sandbox_id, info)

    async def kill(self, process_id: str, signal: int | str = "SIGKILL") -> None:
        await self._client._send(control_process(self._sandbox_id, process_id, signal=signal))

    async def send_stdin(self, process_id: str, data: str) -> None:
        await self._client._send(control_process(self._sandbox_id, process_id, stdin=data))


class AsyncShell(_Handle["AsyncSandboxClient"]):
    """`Shell` with `await`."""

    async def run(self, command: str, *, timeout: float | None = None, output_limit: int | None = None
                  ) -> ExecResult:
        return await self._client._send(run_in_shell(self._sandbox_id, self.id, command, timeout, output_limit))

    async def close(self) -> None:
        with contextlib.suppress(errors.ProcessNotFound, errors.SandboxNotFound):
            await self._client._send(delete_process(self._sandbox_id, self.id))

    async def __aenter__(self) -> AsyncShell:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


async def open_async_shell(client: AsyncSandboxClient, sandbox_id: str, **fields: Any) -> AsyncShell:
    return AsyncShell(client, sandbox_id, await client._send(start_shell(sandbox_id, **fields)))
