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
import ssl
import sys
import time
from collections import deque
from collections.abc import AsyncIterator

import httpx

from rollbox.client._connection import Connection, ReadDeadlines, within
from rollbox.client._http import Timeouts


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
        self._deadlines = ReadDeadlines()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop the connections belong to: a socket's transport works on its own loop only."""
        self._idle: deque[Connection] = deque()
        """Idle connections, the most recently freed on the right: taken from there, expired ones pruned from
        the left."""
        self._busy: set[Connection] = set()
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

    async def _acquire(self, timeouts: Timeouts) -> Connection:
        if self._slots.locked():
            await within(self._slots.acquire(), timeouts.get("pool"), httpx.PoolTimeout,
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
        self._deadlines = ReadDeadlines()
        self._loop = loop

    def _idle_connection(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and not self._expired(connection, now):
                return connection
            connection.close()
        return None

    async def _connect(self, timeout: float | None) -> Connection:
        connection = Connection(self._deadlines)
        loop = asyncio.get_running_loop()
        if self._socket is None:
            connecting = loop.create_connection(lambda: connection, self._host, self._port, ssl=self._ssl)
            address = f"{self._host}:{self._port}"
        else:
            connecting, address = loop.create_unix_connection(lambda: connection, self._socket), self._socket
        try:
            await within(connecting, timeout, httpx.ConnectTimeout, f"could not connect to {address}")
        except OSError as error:
            raise httpx.ConnectError(str(error) or type(error).__name__) from error
        self.connections_opened += 1
        return connection

    def _expired(self, connection: Connection, now: float) -> bool:
        expiry = self._keepalive_expiry
        return expiry is not None and now - connection.idle_since > expiry

    def _release(self, connection: Connection) -> None:
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

    def __init__(self, pool: PoolTransport, connection: Connection, status_code: int, reason_phrase: str,
                 timeout: float | None) -> None:
        self.status_code = status_code
        self.reason_phrase = reason_phrase
        self._pool = pool
        self._connection: Connection | None = connection
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
