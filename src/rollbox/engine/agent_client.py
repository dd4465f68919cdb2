"""Talks to a container's exec agent over its unix socket: one connection per command.

The wire format is described at the top of `agent/agent.c`. A blocking client serves the engine's
own calls; an asyncio one serves the server, which streams output while the command runs. Both give
up on an agent by the same timeouts (`CONNECT_TIMEOUT`, `AgentRequest.answer_timeout`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rollbox import tracing
from rollbox.errors import Conflict, PortClosed, SandboxNotRunning
from rollbox.models import ExecResult

OutputCallback = Callable[[str], None]
_HEADER = struct.Struct(">cI")
CONNECT_TIMEOUT = 5.0
"""Seconds to reach an agent before it counts as lost."""
ANSWER_TIMEOUT = 30.0
"""Seconds to wait for the agent to answer an operation that is not a command or a stream before it counts as
lost."""
ANSWER_GRACE = 30.0
"""Seconds past a command's timeout after which its agent counts as lost. The agent enforces the timeout
itself; this only guards against an agent that stopped answering."""


@dataclass
class AgentRequest:
    """One command as the agent takes it: the fields of the wire `ExecRequest`, resolved for the container
    (an argv, the full environment, a numeric user, the output limit in force)."""

    command: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    user: tuple[int, int, tuple[int, ...]] | None = None
    timeout: float | None = None
    output_limit: int = 1 << 20
    stdin: bytes | None = None
    isolated: bool = False

    @property
    def answer_timeout(self) -> float | None:
        """Seconds to wait for the agent's answer; None (no limit) for a command without a timeout."""
        return None if self.timeout is None else self.timeout + ANSWER_GRACE

    def encode(self) -> bytes:
        frames = [_frame(b"a", arg.encode()) for arg in self.command]
        frames += [_frame(b"e", f"{key}={value}".encode()) for key, value in self.env.items()]
        if self.cwd:
            frames.append(_frame(b"d", self.cwd.encode()))
        if self.user:
            uid, gid, groups = self.user
            frames.append(_frame(b"u", " ".join(str(n) for n in (uid, gid, *groups)).encode()))
        if self.timeout:
            frames.append(_frame(b"t", str(max(1, int(self.timeout * 1000))).encode()))
        frames.append(_frame(b"l", str(self.output_limit).encode()))
        if self.stdin:
            frames.append(_frame(b"i", self.stdin))
        frames.append(_frame(b"c", b""))
        if self.isolated:
            frames.append(_frame(b"I", b""))
        frames.append(_frame(b"x", b""))
        return b"".join(frames)


def _frame(kind: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


class _Collector:
    """Turns the agent's reply frames into an ExecResult, calling the output callbacks as they come."""

    def __init__(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None) -> None:
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.callbacks = {b"o": on_stdout, b"r": on_stderr}
        self.started = time.perf_counter()
        self.spawned: int | None = None
        """When the agent said the command had started (time.time_ns()), for tracing's split of exec time."""
        self.result: ExecResult | None = None

    def feed(self, kind: bytes, payload: bytes) -> None:
        if kind in (b"o", b"r"):
            (self.out if kind == b"o" else self.err).append(payload)
            callback = self.callbacks[kind]
            if callback:
                callback(payload.decode(errors="replace"))
        elif kind == b"z":
            code, sig, timed_out, out_trunc, err_trunc = (int(x) for x in payload.split())
            self.result = ExecResult(
                exit_code=None if timed_out else code,
                stdout=b"".join(self.out).decode(errors="replace"),
                stderr=b"".join(self.err).decode(errors="replace"),
                timed_out=bool(timed_out),
                signal=sig,
                stdout_truncated=bool(out_trunc),
                stderr_truncated=bool(err_trunc),
                duration_ms=(time.perf_counter() - self.started) * 1000,
            )
        elif kind == b"p":
            self.spawned = time.time_ns()


def _lost(container_id: str) -> SandboxNotRunning:
    return SandboxNotRunning("no longer answers (deleted, paused or killed): reset it or start a new one",
                             container_id=container_id)


class AgentClient:
    def __init__(self, socket_path: str, container_id: str) -> None:
        self.socket_path = socket_path
        self.container_id = container_id

    def _connect(self, timeout: float | None = CONNECT_TIMEOUT) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise _lost(self.container_id) from None
        return sock

    def ping(self, timeout: float = 2.0) -> bool:
        try:
            sock = self._connect(timeout)
        except SandboxNotRunning:
            return False
        with sock:
            try:
                sock.sendall(_frame(b"P", b""))
                return _recv_exact(sock, 5)[:1] == b"P"
            except OSError:
                return False

    def hold(self) -> None:
        """Asks the agent to close its socket while its hold file exists (a checkpoint's first step)."""
        with self._connect() as sock:
            try:
                sock.sendall(_frame(b"H", b""))
                _recv_exact(sock, 5)
            except (OSError, EOFError):
                raise _lost(self.container_id) from None

    def exchange(self, kind: bytes, payload: bytes = b"") -> bytes:
        """Sends one frame the agent answers in its main process (D, Q) and returns its answer's payload; an
        answer of another kind (E: the agent refused it) raises Conflict with the agent's reason."""
        with self._connect() as sock:
            sock.settimeout(ANSWER_TIMEOUT)
            try:
                sock.sendall(_frame(kind, payload))
                answer, length = _HEADER.unpack(_recv_exact(sock, 5))
                data = _recv_exact(sock, length) if length else b""
            except (OSError, EOFError):
                raise _lost(self.container_id) from None
        if answer != kind:
            raise Conflict(f"container {self.container_id}: {data.decode(errors='replace')}")
        return data

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while not self.ping():
            if time.monotonic() > deadline:
                raise _lost(self.container_id)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def run(
        self,
        request: AgentRequest,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        collector = _Collector(on_stdout, on_stderr)
        sock = self._connect()
        sock.settimeout(request.answer_timeout)
        with sock:
            try:
                sock.sendall(request.encode())
                while collector.result is None:
                    kind, length = _HEADER.unpack(_recv_exact(sock, 5))
                    collector.feed(kind, _recv_exact(sock, length) if length else b"")
            except (OSError, EOFError):
                raise _lost(self.container_id) from None
        return collector.result

    async def run_async(
        self,
        request: AgentRequest,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        collector = _Collector(on_stdout, on_stderr)
        connecting = time.time_ns()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=1 << 20)
        except (OSError, TimeoutError):
            raise _lost(self.container_id) from None
        try:
            async with asyncio.timeout(request.answer_timeout):
                writer.write(request.encode())
                await writer.drain()
                while collector.result is None:
                    kind, length = _HEADER.unpack(await reader.readexactly(5))
                    collector.feed(kind, await reader.readexactly(length) if length else b"")
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            raise _lost(self.container_id) from None
        finally:
            writer.close()
        if tracing.on:
            tracing.exec_phases(connecting, collector.spawned, time.time_ns())
        return collector.result


    async def open_port(self, port: int, pass_socket: bool) -> socket.socket:
        """A connected socket to `port` on the sandbox's loopback (agent/port.c): the sandbox's own TCP socket when
        `pass_socket` (the runtime lets descriptors cross), else the agent's connection, which relays the port's
        bytes from then on. Non-blocking. Raises PortClosed when nothing listens there."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await loop.sock_connect(sock, self.socket_path)
        except (OSError, TimeoutError):
            sock.close()
            raise _lost(self.container_id) from None
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT):
                await loop.sock_sendall(sock, (_frame(b"F", b"") if pass_socket else b"")
                                        + _frame(b"N", str(port).encode()))
                head, fds = await _receive_with_fds(loop, sock, _HEADER.size)
                kind, length = _HEADER.unpack(head)
                message = b""
                while len(message) < length:
                    chunk = await loop.sock_recv(sock, length - len(message))
                    if not chunk:
                        raise EOFError
                    message += chunk
        except (OSError, EOFError, struct.error, TimeoutError):
            sock.close()
            raise _lost(self.container_id) from None
        if kind != b"N":
            sock.close()
            raise PortClosed(message.decode(errors="replace") or f"port {port} could not be opened")
        if not pass_socket:
            return sock
        sock.close()
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise _lost(self.container_id)
        opened = socket.socket(fileno=fds[0])
        opened.setblocking(False)
        return opened


async def _receive_with_fds(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int
                            ) -> tuple[bytes, list[int]]:
    """Exactly `size` bytes of a non-blocking unix socket and the descriptors that came with them."""
    data, fds = b"", []
    while len(data) < size:
        try:
            chunk, received, _, _ = socket.recv_fds(sock, size - len(data), 4)
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), _settle, ready)
            try:
                await ready
            finally:
                loop.remove_reader(sock.fileno())
            continue
        if not chunk:
            raise EOFError
        data += chunk
        fds += received
    return data, fds


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
