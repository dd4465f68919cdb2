"""A container's background processes, terminals and shell sessions, through its exec agent.

The agent keeps each background process's output in the sandbox (`agent/processes.c` has the wire format),
so the host holds nothing between calls: every operation is one short connection, and a stream of events
reads the agent's socket only as fast as its consumer takes events, so a reader that stops leaves the
output to the agent's bounded ring, never to the host's memory. A shell session's commands are `shells`'.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rollbox.engine.agent_client import (
    _HEADER,
    ANSWER_TIMEOUT,
    CONNECT_TIMEOUT,
    AgentClient,
    AgentRequest,
    _frame,
    _lost,
)
from rollbox.engine.shells import SHELL, ShellRun
from rollbox.errors import (
    CapacityExceeded,
    Conflict,
    InvalidRequest,
    ProcessNotFound,
    RollboxError,
    SandboxNotRunning,
)
from rollbox.models import ExecResult, ProcessControl, ProcessEvent, ProcessInfo, ProcessRequest, ShellCommand

BuildRequest = Callable[..., AgentRequest]
"""Makes the agent's request for a command from a caller's options (`Engine._agent_request`, bound)."""
PTY_TERM = "xterm-256color"
STREAM_BUFFER = 1 << 16
"""Bytes of a process's output a stream reads ahead of its consumer (asyncio holds up to twice this): what the
host holds for a reader that stopped reading. The rest waits in the agent's ring."""
RELISTEN_WAIT = 30.0
"""Seconds a stream that a checkpoint let go of waits for the sandbox to listen again (a fork's restores)."""
NO_ROOM = b"rollbox-agent: fork failed"
"""How the agent answers a connection it had no process to serve (the sandbox is at its pids limit)."""
NO_ROOM_RETRIES = 100
"""Tries, 50 ms apart, at a sandbox at its pids limit: killing a fork bomb needs one connection to get through."""


def _line(kind: bytes, text: str | int) -> bytes:
    return _frame(kind, str(text).encode())


def _error(message: str, process_id: str) -> RollboxError:
    if message == "no such process":
        return ProcessNotFound(f"process {process_id!r} does not exist in this sandbox (ended and forgotten, or "
                               "its sandbox was reset)")
    if message.startswith("process id"):
        return InvalidRequest(message)
    if "exists" in message:
        return Conflict(message)
    return CapacityExceeded(message)


def _info(payload: bytes) -> ProcessInfo:
    fields = payload.split(b"\0")[:-1]
    text = [f.decode(errors="replace") for f in fields]
    pid, running, code, sig, timed_out, pty, shell, started = (int(x) for x in text[1:9])
    cwd, tag, *command = [*text[9:], "", ""][:2] + text[11:]  # the agent leaves out what its description lacks room for
    return ProcessInfo(
        id=text[0], pid=pid, running=bool(running), exit_code=None if running or timed_out else code, signal=sig,
        timed_out=bool(timed_out), pty=bool(pty), shell=bool(shell), started_at=started / 1000,
        cwd=cwd or None, tag=tag or None, command=command,
    )


@dataclass
class _Connection:
    """One connection to the agent, read frame by frame."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    process_id: str

    async def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))
        await self.writer.drain()

    async def frame(self) -> tuple[bytes, bytes]:
        kind, length = _HEADER.unpack(await self.reader.readexactly(5))
        payload = await self.reader.readexactly(length) if length else b""
        if kind == b"E":
            raise _error(payload.decode(errors="replace"), self.process_id)
        return kind, payload

    async def acknowledged(self, first: bool = False) -> tuple[int, int]:
        """Waits for the answer to a batch, skipping output: (pid, offset)."""
        while True:
            kind, payload = await self.frame()
            if first and kind == b"r" and payload.startswith(NO_ROOM):
                raise _NoRoom
            if kind == b"k":
                pid, offset = payload.split()
                return int(pid), int(offset)


class ContainerProcesses:
    """The background processes of one container."""

    def __init__(self, agent: AgentClient, build: BuildRequest, output_limit: int) -> None:
        self._agent = agent
        self._build = build
        self._output_limit = output_limit
        """The container's output limit: what a shell command keeps of each stream unless it says otherwise."""

    async def _connect(self, process_id: str = "") -> _Connection:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_unix_connection(self._agent.socket_path, limit=STREAM_BUFFER)
        except (OSError, TimeoutError):
            raise _lost(self._agent.container_id) from None
        return _Connection(reader, writer, process_id)

    async def _exchange(self, process_id: str, frames: Sequence[bytes], until: bytes) -> list[tuple[bytes, bytes]]:
        """Sends `frames` on a new connection and reads the answer up to a frame of kind `until`."""
        for _ in range(NO_ROOM_RETRIES):
            connection = await self._connect(process_id)
            try:
                async with asyncio.timeout(ANSWER_TIMEOUT):
                    await connection.send(*frames)
                    answer = []
                    while True:
                        kind, payload = await connection.frame()
                        if kind == b"r" and payload.startswith(NO_ROOM):
                            raise _NoRoom
                        answer.append((kind, payload))
                        if kind == until:
                            return answer
            except _NoRoom:
                await asyncio.sleep(0.05)
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                raise _lost(self._agent.container_id) from None
            finally:
                connection.writer.close()
        raise _no_room()

    async def _attached(self, process_id: str, offset: int | None) -> tuple[_Connection, int, int]:
        """A connection following the process's output from `offset`, with its pid and the offset it starts at."""
        for _ in range(NO_ROOM_RETRIES):
            connection = await self._connect(process_id)
            try:
                async with asyncio.timeout(ANSWER_TIMEOUT):
                    await connection.send(_frame(b"A", process_id.encode()),
                                          _line(b"f", -1 if offset is None else offset), _frame(b"x", b""))
                    pid, start = await connection.acknowledged(first=True)
                    return connection, pid, start
            except _NoRoom:
                connection.writer.close()
                await asyncio.sleep(0.05)
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                connection.writer.close()
                raise _lost(self._agent.container_id) from None
            except BaseException:
                connection.writer.close()
                raise
        raise _no_room()

    async def start(self, request: ProcessRequest, *, env: dict[str, str] | None = None, shell: bool = False
                    ) -> ProcessInfo:
        """Starts `request` in the background; `env` is its whole extra environment (the claim's and the request's)."""
        if isinstance(request.command, list) and not request.command:
            raise InvalidRequest("the command is empty")
        if request.pty:
            env = {"TERM": PTY_TERM, **(env or {})}
        agent_request = self._build(request.command, timeout=request.timeout, env=env, cwd=request.cwd,
                                    user=request.user, stdin=request.stdin, output_limit=request.output_limit,
                                    isolated=False)
        process_id = secrets.token_hex(6)
        frames = [_frame(b"B", process_id.encode()), *_request_frames(agent_request)]
        if not request.close_stdin:
            frames = [f for f in frames if f != _frame(b"c", b"")]
        if request.pty:
            frames.append(_line(b"T", f"{request.pty.rows} {request.pty.cols}"))
        if request.tag:
            frames.append(_frame(b"n", request.tag.encode()))
        if shell:
            frames.append(_frame(b"S", b""))
        frames.append(_frame(b"x", b""))
        (_, payload), = await self._exchange(process_id, frames, b"q")
        return _info(payload)

    async def start_shell(self, *, env: dict[str, str] | None, cwd: str | None, user: str | None,
                          shell: str | None) -> ProcessInfo:
        command = [shell] if shell else ["/bin/sh", "-c", SHELL]
        return await self.start(ProcessRequest(command=command, cwd=cwd, user=user), env=env, shell=True)

    async def list(self) -> list[ProcessInfo]:
        answer = await self._exchange("", [_frame(b"L", b"")], b"k")
        return [_info(payload) for kind, payload in answer if kind == b"q"]

    async def get(self, process_id: str) -> ProcessInfo:
        for info in await self.list():
            if info.id == process_id:
                return info
        raise _error("no such process", process_id)

    async def control(self, process_id: str, request: ProcessControl) -> None:
        frames = [_frame(b"A", process_id.encode())]
        if request.stdin:
            frames.append(_frame(b"i", request.stdin.encode()))
        if request.close_stdin:
            frames.append(_frame(b"c", b""))
        if request.resize:
            frames.append(_line(b"w", f"{request.resize.rows} {request.resize.cols}"))
        if request.signal:
            frames.append(_line(b"s", request.signal))
        await self._exchange(process_id, [*frames, _frame(b"x", b"")], b"k")

    async def delete(self, process_id: str) -> None:
        """Kills the process and everything it started, and forgets it."""
        await self._exchange(process_id, [_frame(b"A", process_id.encode()), _frame(b"K", b""), _frame(b"x", b"")],
                             b"k")

    async def events(self, process_id: str, offset: int | None = 0) -> AsyncIterator[ProcessEvent]:
        """The process's output from `offset` (None: from now) as it comes, then its end.

        A checkpoint (fork, snapshot, standby) makes the agent drop the connection, which gVisor could not save
        (agent.c's hold()): the output is followed again from where it was once the sandbox listens again."""
        connection, pid, at = await self._attached(process_id, offset)
        yield ProcessEvent(type="start", pid=pid, offset=at)
        while connection is not None:
            try:
                async for event in _output(connection, at):
                    at = at if event.offset is None else event.offset
                    yield event
                return
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                connection.writer.close()
            connection = await self._followed_again(process_id, at)
        yield ProcessEvent(type="error", code="sandbox_not_running",
                           message="the sandbox's agent went away (reset, deleted or stopped)")

    async def _followed_again(self, process_id: str, offset: int) -> _Connection | None:
        """A connection following the process again after a checkpoint let go of the last one (None: the agent
        went away for good, or the sandbox stays saved, in standby, for longer than RELISTEN_WAIT)."""
        socket_path = Path(self._agent.socket_path)
        hold = socket_path.with_name(socket_path.name + ".hold")
        if not hold.exists():
            return None
        deadline = asyncio.get_running_loop().time() + RELISTEN_WAIT
        while asyncio.get_running_loop().time() < deadline:
            if not hold.exists() and socket_path.exists():
                with contextlib.suppress(SandboxNotRunning):
                    connection, _, _ = await self._attached(process_id, offset)
                    return connection
            await asyncio.sleep(0.05)
        return None

    async def run_in_shell(self, process_id: str, command: ShellCommand) -> ExecResult:
        """Runs one command in a shell session (see `ShellRun`)."""
        connection, _, _ = await self._attached(process_id, None)
        try:
            return await ShellRun(connection, command, command.output_limit or self._output_limit).run()
        except (OSError, asyncio.IncompleteReadError):
            raise _lost(self._agent.container_id) from None
        finally:
            connection.writer.close()


def _request_frames(request: AgentRequest) -> list[bytes]:
    """The frames of `request` without its final run frame."""
    encoded = request.encode()
    frames, at = [], 0
    while at < len(encoded):
        _, length = _HEADER.unpack_from(encoded, at)
        frames.append(encoded[at:at + 5 + length])
        at += 5 + length
    return frames[:-1]


async def _output(connection: _Connection, offset: int) -> AsyncIterator[ProcessEvent]:
    """Output frames as events (text decoded across chunk boundaries), then the end; the connection's errors (the
    agent let go of it) are the caller's."""
    decoders = {b"o": codecs.getincrementaldecoder("utf-8")("replace"),
                b"r": codecs.getincrementaldecoder("utf-8")("replace")}
    while True:
        kind, payload = await connection.frame()
        if kind in decoders:
            offset += len(payload)
            yield ProcessEvent(type="stdout" if kind == b"o" else "stderr", data=decoders[kind].decode(payload),
                               offset=offset)
        elif kind == b"g":
            offset = int(payload)
            yield ProcessEvent(type="gap", offset=offset)
        elif kind == b"z":
            for stream, decoder in decoders.items():  # an incomplete character at the very end is U+FFFD
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield ProcessEvent(type="stdout" if stream == b"o" else "stderr", data=tail, offset=offset)
            code, sig, timed_out, out_dropped, err_dropped = (int(x) for x in payload.split())
            yield ProcessEvent(type="end", offset=offset, result=ExecResult(
                exit_code=None if timed_out else code, signal=sig, timed_out=bool(timed_out),
                stdout_truncated=bool(out_dropped), stderr_truncated=bool(err_dropped)))
            return


class _NoRoom(Exception):
    """The agent had no process to serve a connection."""


def _no_room() -> CapacityExceeded:
    return CapacityExceeded("the sandbox is at its process limit and its agent cannot serve the call: kill some of "
                            "its processes (or reset it) and try again")
