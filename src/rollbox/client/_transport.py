"""The async client's connection pool: O(1) per request, where httpcore's pool scans every connection on every
request and release (encode/httpcore#1035), which made the client CPU-bound at a few hundred connections.

The HTTP/1.1 protocol stays httpcore's (`AsyncHTTPConnection`); only the pooling is ours. All requests go to one
origin, the router, so the pool is a LIFO stack of idle connections (the most recently used is the most likely
to be alive and warm) under a FIFO semaphore that bounds the connections open at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Protocol, cast

import httpcore
import httpx

_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)
"""httpcore's errors as the httpx ones httpx's own transport raises (most specific first), so that callers
(`connection_failed`, the retries) see the same exception types whichever transport is underneath."""


@contextlib.contextmanager
def _httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as error:
        for core, mapped in _ERRORS:
            if isinstance(error, core):
                raise mapped(str(error)) from error
        raise


class _CoreStream(Protocol):
    """What httpcore's HTTP/1.1 response body offers: its bytes, and a close that settles the connection."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class PoolTransport(httpx.AsyncBaseTransport):
    """Up to `limits.max_connections` keep-alive HTTP/1.1 connections to the origin of `base_url`.

    A request takes the most recently freed idle connection that is still usable, or opens one while fewer than
    the limit are open; otherwise it waits its turn (first come, first served) up to the pool timeout. The
    connection comes back to the pool when the response body is closed, so streamed bodies hold it while read.
    """

    def __init__(self, base_url: str, limits: httpx.Limits) -> None:
        url = httpx.URL(base_url)
        self._origin = httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=b"/").origin
        self._ssl_context = httpx.create_ssl_context() if url.scheme == "https" else None
        self._keepalive_expiry = limits.keepalive_expiry
        self._slots = asyncio.Semaphore(sys.maxsize if limits.max_connections is None else limits.max_connections)
        self._idle: deque[httpcore.AsyncHTTPConnection] = deque()
        """Idle connections, the most recently freed on the right: taken from there, expired ones pruned from
        the left."""
        self._busy: set[httpcore.AsyncHTTPConnection] = set()
        self._backend = httpcore.AnyIOBackend()
        self.connections_opened = 0
        """Connections opened so far: what reuse saves shows here."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        connection = await self._acquire(request.extensions.get("timeout", {}).get("pool"))
        try:
            with _httpx_errors():
                response = await connection.handle_async_request(core_request)
        except BaseException:
            await self._release(connection)
            raise
        return httpx.Response(status_code=response.status, headers=response.headers, extensions=response.extensions,
                              stream=_Body(cast(_CoreStream, response.stream), self, connection))

    async def _acquire(self, timeout: float | None) -> httpcore.AsyncHTTPConnection:
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout(f"no connection to {self._origin} came free in {timeout} s") from None
        try:
            while self._idle:
                connection = self._idle.pop()
                if connection.is_available() and not connection.has_expired():
                    break
                await connection.aclose()
            else:
                connection = httpcore.AsyncHTTPConnection(self._origin, ssl_context=self._ssl_context,
                                                          keepalive_expiry=self._keepalive_expiry,
                                                          network_backend=self._backend)
                self.connections_opened += 1
        except BaseException:
            self._slots.release()
            raise
        self._busy.add(connection)
        return connection

    async def _release(self, connection: httpcore.AsyncHTTPConnection) -> None:
        """Back on the stack if it can take another request (a fully read response on a kept-alive connection),
        else closed; either way its slot goes to the next waiting request."""
        self._busy.discard(connection)
        try:
            if connection.is_available():
                self._idle.append(connection)
                while self._idle and self._idle[0].has_expired():
                    await self._idle.popleft().aclose()
            else:
                await connection.aclose()
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        """Closes every connection, idle or still reading a response."""
        connections = [*self._idle, *self._busy]
        self._idle.clear()
        self._busy.clear()
        for connection in connections:
            await connection.aclose()


class _Body(httpx.AsyncByteStream):
    """A response body that hands its connection back to the pool once closed."""

    def __init__(self, stream: _CoreStream, pool: PoolTransport, connection: httpcore.AsyncHTTPConnection) -> None:
        self._stream = stream
        self._pool = pool
        self._connection: httpcore.AsyncHTTPConnection | None = connection

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        if self._connection is None:
            return
        connection, self._connection = self._connection, None
        try:
            with _httpx_errors():
                await self._stream.aclose()
        finally:
            await self._pool._release(connection)
