"""One keep-alive HTTP/1.1 connection of the async client's pool: it parses answers with httptools (the C parser
uvicorn uses) on asyncio's protocol callbacks, and one timer per pool enforces every waiting connection's read
timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable

import httptools
import httpx

from rollbox.client._http import Timeouts

_FRAMING = (b"content-length", b"transfer-encoding")
"""The headers that say where an answer's body ends."""
READ_BUFFER = 1 << 20
"""Bytes of an answer's body held unread before the connection stops reading from the socket."""
DEADLINE_TICK = 0.05
"""Seconds between two checks of the read deadlines: a read timeout fires up to this late."""


class ReadDeadlines:
    """When each waiting connection's answer is due, checked by one timer every DEADLINE_TICK while any waits.

    A timer set and cancelled around every wait (`asyncio.timeout`) cost a quarter of the client's CPU per call
    (docs/design-notes.md), most of it in the loop's heap of timers. A read timeout
    only guards against a router that stopped answering, so it may fire a little late.
    """

    def __init__(self) -> None:
        self._due: dict[Connection, tuple[float, float]] = {}
        """Each waiting connection's deadline (loop time) and the timeout it came from."""
        self._sweeping = False

    def add(self, connection: Connection, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._due[connection] = (loop.time() + timeout, timeout)
        if not self._sweeping:
            self._sweeping = True
            loop.call_later(min(DEADLINE_TICK, timeout), self._sweep, loop)

    def discard(self, connection: Connection) -> None:
        self._due.pop(connection, None)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for connection, (due, timeout) in list(self._due.items()):
            if due <= now:
                del self._due[connection]
                connection.expire(timeout)
        self._sweeping = bool(self._due)
        if self._sweeping:
            loop.call_later(DEADLINE_TICK, self._sweep, loop)


class Connection(asyncio.Protocol):
    """One keep-alive connection: a request written whole, its answer parsed as it arrives.

    The httptools callbacks (`on_*`) fill in the answer; `send` waits for its head, `next_part` for each
    piece of its body. A connection the server closed while idle is never handed out again.
    """

    def __init__(self, deadlines: ReadDeadlines) -> None:
        self._deadlines = deadlines
        self._transport: asyncio.Transport | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._parts: deque[bytes] = deque()
        self._buffered = 0
        self._error: httpx.TransportError | None = None
        self._reason = b""
        self._framed = False
        """The answer says where its body ends (a length or chunks); else the body ends when the server closes."""
        self._head_done = False
        self._complete = False
        self._keep_alive = False
        """Both sides keep the connection open after this answer (read with the head: the parser forgets it)."""
        self.closed = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._parser is None or self._complete:  # a server speaking out of turn cannot be trusted again
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            if not self._complete:  # bytes after a whole answer (a 204 with a body) only cost the connection
                self._fail(httpx.RemoteProtocolError(f"the server's answer is not valid HTTP/1.1: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._parser is None or self._complete:
            return
        if self._head_done and not self._framed:  # the body ended with the connection, as it had to
            self.on_message_complete()
        elif exc is not None:
            self._fail(httpx.ReadError(str(exc) or type(exc).__name__))
        elif not self._head_done:
            self._fail(httpx.RemoteProtocolError("Server disconnected without sending a response."))
        else:
            self._fail(httpx.RemoteProtocolError("the server closed the connection before the end of the answer"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- httptools callbacks ------------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in _FRAMING:
            self._framed = True

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        if self._parser.get_status_code() < 200:  # an interim answer (100 Continue): the real one follows
            self._reason, self._framed = b"", False
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._parts.append(body)
        self._buffered += len(body)
        if self._buffered > READ_BUFFER and self._transport is not None:
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._head_done:
            self._complete = True
            self._wake()

    # -- what the pool uses -------------------------------------------------------------------

    async def send(self, request: bytes, timeouts: Timeouts) -> tuple[int, bytes]:
        """Writes the request, waits for the answer's head: its status and reason. The body follows through
        `next_part`."""
        assert self._transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._reason, self._framed, self._head_done, self._complete = b"", False, False, False
        self._transport.write(request)
        await self._drained(timeouts.get("write"))
        while not self._head_done:
            await self._wait(timeouts.get("read"))
        return self._parser.get_status_code(), self._reason

    async def next_part(self, timeout: float | None) -> bytes | None:
        """The next piece of the body, or None at its end."""
        while not self._parts:
            if self._complete:
                return None
            await self._wait(timeout)
        part = self._parts.popleft()
        self._buffered -= len(part)
        if self._buffered <= READ_BUFFER and self._transport is not None and not self.closed:
            self._transport.resume_reading()
        return part

    @property
    def reusable(self) -> bool:
        """It carried a whole answer, and both sides keep it open."""
        return not self.closed and self._complete and not self._parts and self._keep_alive

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            # A call abandoned when its event loop closed is finalised later: the socket then goes with the loop.
            with contextlib.suppress(RuntimeError):
                self._transport.close()

    async def _drained(self, timeout: float | None) -> None:
        if self._error is not None:
            raise self._error
        if self._writable is not None and not self.closed:
            await within(self._writable, timeout, httpx.WriteTimeout, "the request could not be sent")

    async def _wait(self, timeout: float | None) -> None:
        if self._error is not None:
            raise self._error
        if self.closed:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        self._waiter = asyncio.get_running_loop().create_future()
        if timeout is not None:
            self._deadlines.add(self, timeout)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timeout is not None:
                self._deadlines.discard(self)
        if self._error is not None:
            raise self._error

    def expire(self, timeout: float) -> None:
        """Ends the wait for the answer: it did not come within `timeout` seconds."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(httpx.ReadTimeout(f"no answer from the server in {timeout} s"))

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: httpx.TransportError) -> None:
        self._error = error
        self._wake()


async def within(step: Awaitable[object], timeout: float | None, expired: type[httpx.TimeoutException],
                  what: str) -> None:
    """Awaits `step`, raising `expired` ("<what> in <timeout> s") if it takes longer than `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            await step
    except TimeoutError:
        raise expired(f"{what} in {timeout} s") from None
