"""Background processes, terminals and shell sessions in the SDK (docs/processes.md).

`commands.run(cmd, background=True)` returns a handle on a process that keeps running between calls: wait for
it, stream its output (again, from any offset, after a reconnect), send it stdin and signals, resize its
terminal. `commands.list()` and `commands.connect(id)` find processes again; `sandbox.shell()` is a session
whose directory and variables carry from one command to the next. The calls are `_processes`'; the blocking
and asyncio classes here only move the bytes, each through the narrow part of its client it needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any, Generic, Protocol, TypeVar

import httpx

from rollbox import errors
from rollbox.client._call import Call
from rollbox.client._exchange import Exchange
from rollbox.client._http import connection_failed
from rollbox.client._options import Command, OutputCallback
from rollbox.client._processes import (
    BackgroundOptions,
    Collector,
    control_process,
    delete_process,
    events_target,
    get_process,
    list_processes,
    parse_event,
    run_in_shell,
    start_process,
    start_shell,
    stream_events,
)
from rollbox.models import ExecResult, ProcessEvent, ProcessInfo, PtySize

T = TypeVar("T")
C = TypeVar("C")
"""The client a handle calls through: a `Client` or an `AsyncClient`."""


class Client(Protocol):
    """What a blocking handle calls through (`SandboxClient`): a call, and an NDJSON answer's lines."""

    def _send(self, call: Call[T]) -> T: ...
    def _lines(self, method: str, path: str, *, params: dict[str, str] | None = None, content: str | None = None,
               headers: dict[str, str] | None = None, wait: float | None = None) -> Iterator[str]: ...


class AsyncClient(Protocol):
    """What an asyncio handle calls through (`AsyncSandboxClient`): a call, and the exchange streams go over."""

    _exchange: Exchange

    @property
    def base_url(self) -> str: ...
    async def _send(self, call: Call[T]) -> T: ...


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


class ProcessHandle(_Handle[Client]):
    """A background process of a sandbox. Holding one costs nothing; each method is one HTTP call."""

    def refresh(self) -> ProcessInfo:
        self.info = self._client._send(get_process(self._sandbox_id, self.id))
        return self.info

    def events(self, offset: int | None = 0) -> Iterator[ProcessEvent]:
        """Its output from byte `offset` of what is kept (None: from now) as it comes, then its end."""
        path, params = events_target(self._sandbox_id, self.id, offset)
        for line in self._client._lines("GET", path, params=params):
            event = parse_event(line)
            if event is not None:
                yield event

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

    _client: Client
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


class Shell(_Handle[Client]):
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


def open_shell(client: Client, sandbox_id: str, **fields: Any) -> Shell:
    return Shell(client, sandbox_id, client._send(start_shell(sandbox_id, **fields)))


# -- asyncio --------------------------------------------------------------------------------------

class AsyncProcessHandle(_Handle[AsyncClient]):
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

    _client: AsyncClient
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


class AsyncShell(_Handle[AsyncClient]):
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


async def open_async_shell(client: AsyncClient, sandbox_id: str, **fields: Any) -> AsyncShell:
    return AsyncShell(client, sandbox_id, await client._send(start_shell(sandbox_id, **fields)))
