"""The async client's HTTP/1.1 transport: a connection pool that is O(1) per request, and connections that
parse answers with httptools (the C parser uvicorn uses) on asyncio's protocol callbacks.

It takes a request as the bytes to write and gives back the answer's status and body: no request or response
models on the way: httpx's own transport and models cost the async client most of its CPU per call, and scanned
the whole pool on every request (encode/httpcore#1035; figures in docs/design-notes.md). All requests go to one
origin, the router, so the pool is a LIFO
stack of idle connections (the most recently used is the most likely to be alive) under a FIFO semaphore that
bounds the connections open at once. Failures are httpx's transport errors, which both clients already handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable

import httptools
import httpx

from rollbox.client._http import Timeouts

_FRAMING = (b"content-length", b"transfer-encoding")
"""The headers that say where an answer's body ends."""
READ_BUFFER = 1 << 20
"""Bytes of an answer's body held unread before the connection stops reading from the socket."""
DEADLINE_TICK = 0.05
"""Seconds between two checks of the read deadlines: a read timeout fires up to this late."""


class _ReadDeadlines:
    """When each waiting connection's answer is due, checked by one timer every DEADLINE_TICK while any waits.

    A timer set and cancelled around every wait (`asyncio.timeout`) cost a quarter of the client's CPU per call
    (docs/design-notes.md), most of it in the loop's heap of timers. A read timeout
    only guards against a router that stopped answering, so it may fire a little late.
    """

    def __init__(self) -> None:
        self._due: dict[_Connection, tuple[float, float]] = {}
        """Each waiting connection's deadline (loop time) and the timeout it came from."""
        self._sweeping = False

    def add(self, connection: _Connection, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._due[connection] = (loop.time() + timeout, timeout)
        if not self._sweeping:
            self._sweeping = True
            loop.call_later(min(DEADLINE_TICK, timeout), self._sweep, loop)

    def discard(self, connection: _Connection) -> None:
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


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request written whole, its answer parsed as it arrives.

    The httptools callbacks (`on_*`) fill in the answer; `send` waits for its head, `next_part` for each
    piece of its body. A connection the server closed while idle is never handed out again.
    """

    def __init__(self, deadlines: _ReadDeadlines) -> None:
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
            await _within(self._writable, timeout, httpx.WriteTimeout, "the request could not be sent")

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


async def _within(step: Awaitable[object], timeout: float | None, expired: type[httpx.TimeoutException],
                  what: str) -> None:
    """Awaits `step`, raising `expired` ("<what> in <timeout> s") if it takes longer than `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            await step
    except TimeoutError:
        raise expired(f"{what} in {timeout} s") from None


class PoolTransport:
    """Up to `limits.max_connections` keep-alive HTTP/1.1 connections to the origin of `base_url` (through the unix
    `socket` when given).

    A request takes the most recently freed idle connection that is still open, or opens one while fewer than
    the limit are open; otherwise it waits its turn (first come, first served) up to the pool timeout. The
    connection comes back to the pool once the answer is read or closed, so streamed answers hold it while read.
    """

    def __init__(self, base_url: str, limits: httpx.Limits, *, socket: str | None = None) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https"):
            raise ValueError(f"{base_url}: the rollbox client speaks http or https")
        self._host = url.host
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._socket = socket
        self._ssl: ssl.SSLContext | None = httpx.create_ssl_context() if url.scheme == "https" else None
        self._keepalive_expiry = limits.keepalive_expiry
        self._max_connections = sys.maxsize if limits.max_connections is None else limits.max_connections
        self._slots = asyncio.Semaphore(self._max_connections)
        self._deadlines = _ReadDeadlines()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop the connections belong to: a socket's transport works on its own loop only."""
        self._idle: deque[_Connection] = deque()
        """Idle connections, the most recently freed on the right: taken from there, expired ones pruned from
        the left."""
        self._busy: set[_Connection] = set()
        self.connections_opened = 0
        """Connections opened so far: what reuse saves shows here."""
        self._closed = False

    async def send(self, request: bytes, timeouts: Timeouts) -> Reply:
        """Sends `request` (its head and body, written out) and waits for the answer's head."""
        if self._closed:
            raise RuntimeError("this client is closed: make a new one to send more calls")
        if (loop := asyncio.get_running_loop()) is not self._loop:
            self._move_to(loop)
        connection = await self._acquire(timeouts)
        try:
            status, reason = await connection.send(request, timeouts)
        except BaseException:
            connection.close()  # cancelled or failed mid-request: what is left on the wire is unknown
            self._release(connection)
            raise
        return Reply(self, connection, status, reason.decode("latin-1"), timeouts.get("read"))

    async def _acquire(self, timeouts: Timeouts) -> _Connection:
        if self._slots.locked():
            await _within(self._slots.acquire(), timeouts.get("pool"), httpx.PoolTimeout,
                          "no connection to the router came free")
        else:  # a free slot is taken at once: no timer to set
            await self._slots.acquire()
        try:
            connection = self._idle_connection() or await self._connect(timeouts.get("connect"))
        except BaseException:
            self._slots.release()
            raise
        self._busy.add(connection)
        return connection

    def _move_to(self, loop: asyncio.AbstractEventLoop) -> None:
        """Starts over on `loop` when the client's last loop has stopped (another `asyncio.run`, say): the
        connections opened there went with it. A loop still running elsewhere keeps them: using the pool from
        two threads at once would corrupt it."""
        if self._loop is not None and self._loop.is_running():
            raise RuntimeError("this client is in use on another event loop (in another thread): give each event "
                               "loop a client of its own")
        for connection in [*self._idle, *self._busy]:
            connection.close()
        self._idle.clear()
        self._busy.clear()
        self._slots = asyncio.Semaphore(self._max_connections)
        self._deadlines = _ReadDeadlines()
        self._loop = loop

    def _idle_connection(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and not self._expired(connection, now):
                return connection
            connection.close()
        return None

    async def _connect(self, timeout: float | None) -> _Connection:
        connection = _Connection(self._deadlines)
        loop = asyncio.get_running_loop()
        if self._socket is None:
            connecting = loop.create_connection(lambda: connection, self._host, self._port, ssl=self._ssl)
            address = f"{self._host}:{self._port}"
        else:
            connecting, address = loop.create_unix_connection(lambda: connection, self._socket), self._socket
        try:
            await _within(connecting, timeout, httpx.ConnectTimeout, f"could not connect to {address}")
        except OSError as error:
            raise httpx.ConnectError(str(error) or type(error).__name__) from error
        self.connections_opened += 1
        return connection

    def _expired(self, connection: _Connection, now: float) -> bool:
        expiry = self._keepalive_expiry
        return expiry is not None and now - connection.idle_since > expiry

    def _release(self, connection: _Connection) -> None:
        """Back on the stack if it can carry another request, else closed; either way its slot goes to the next
        waiting request."""
        if connection not in self._busy:  # opened on a loop the client has left: its slot went with it
            connection.close()
            return
        self._busy.discard(connection)
        if connection.reusable:
            connection.idle_since = now = time.monotonic()
            self._idle.append(connection)
            while self._idle and self._expired(self._idle[0], now):
                self._idle.popleft().close()
        else:
            connection.close()
        self._slots.release()

    async def aclose(self) -> None:
        """Closes every connection, idle or still reading a response; later requests are refused."""
        self._closed = True
        for connection in [*self._idle, *self._busy]:
            connection.close()
        self._idle.clear()
        self._busy.clear()


class Reply:
    """An answer whose head has arrived. Its body is read off its connection, which goes back to the pool once the
    body is read to its end or the reply is closed."""

    def __init__(self, pool: PoolTransport, connection: _Connection, status_code: int, reason_phrase: str,
                 timeout: float | None) -> None:
        self.status_code = status_code
        self.reason_phrase = reason_phrase
        self._pool = pool
        self._connection: _Connection | None = connection
        self._timeout = timeout

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    async def read(self) -> bytes:
        """The whole body; the connection is freed, whatever happens."""
        parts = []
        try:
            while (part := await self._next()) is not None:
                parts.append(part)
        finally:
            self.close()
        return b"".join(parts)

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines (NDJSON's), each as soon as it is complete; close the reply if you stop early."""
        pending = b""
        while (part := await self._next()) is not None:
            *complete, pending = (pending + part).split(b"\n")
            for line in complete:
                yield line.removesuffix(b"\r").decode(errors="replace")
        if pending:
            yield pending.decode(errors="replace")

    async def _next(self) -> bytes | None:
        """The body's next piece; None, and the connection freed, after the last."""
        part = None if self._connection is None else await self._connection.next_part(self._timeout)
        if part is None:
            self.close()
        return part

    def close(self) -> None:
        """Frees the connection; one whose answer was not read to its end is closed, not reused."""
        if self._connection is None:
            return
        connection, self._connection = self._connection, None
        self._pool._release(connection)
