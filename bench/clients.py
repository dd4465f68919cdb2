"""The two clients every phase of bench/server.py runs through, and how the phases drive them.

The SDK's AsyncSandboxClient is the product path; the raw HTTP/1.1 keep-alive client (sockets and hand-written
requests) is the floor of what a client costs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from rollbox.client import AsyncSandboxClient
from rollbox.client._http import DEFAULT_TIMEOUT, Settings

MAX_CONNECTIONS = 256
"""Connections each client opens at most: the SDK's default, so a burst queues the same way in both."""


class Client(Protocol):
    """What the phases need of a client; a handle is whatever the client holds for a claimed sandbox."""

    name: str
    label: str

    async def claim(self, pool: str) -> Any: ...

    async def run(self, handle: Any, command: str | list[str], isolated: bool = False) -> tuple[int | None, str]: ...

    async def delete(self, handle: Any) -> None: ...

    async def connect(self, count: int) -> None:
        """Opens `count` connections, so that no timed call pays for one."""

    async def close(self) -> None: ...


class SdkClient:
    name = "sdk"
    label = "SDK (AsyncSandboxClient)"

    def __init__(self, url: str, token: str | None) -> None:
        self.client = AsyncSandboxClient(url, token, max_connections=MAX_CONNECTIONS)

    async def claim(self, pool: str) -> Any:
        return await self.client.create_sandbox(warmpool=pool)

    async def run(self, handle: Any, command: str | list[str], isolated: bool = False) -> tuple[int | None, str]:
        result = await handle.run(command, isolated=isolated)
        return result.exit_code, result.stdout

    async def delete(self, handle: Any) -> None:
        await handle.delete()

    async def connect(self, count: int) -> None:
        await asyncio.gather(*(self.client.health() for _ in range(count)))

    async def close(self) -> None:
        await self.client.close()


class RawConnection:
    """One keep-alive HTTP/1.1 connection; answers must carry a content-length (the router's do)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"transfer-encoding":
                raise RuntimeError("the raw client reads only answers with a content-length")
        return int(lines[0].split(b" ", 2)[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


class RawClient:
    """Requests written by hand over a few kept-alive sockets: what the router answers with no client overhead."""

    name = "raw"
    label = "raw HTTP/1.1 keep-alive"

    def __init__(self, url: str, token: str | None) -> None:
        settings = Settings(url, token, DEFAULT_TIMEOUT)
        self.socket = settings.socket
        parts = urlsplit(settings.origin)
        if parts.scheme != "http" or parts.hostname is None:
            raise RuntimeError(f"{url}: the raw client speaks plain http only")
        self.host, self.port = parts.hostname, parts.port or 80
        auth = f"authorization: Bearer {token}\r\n" if token else ""
        self.headers = f"host: {parts.netloc}\r\n{auth}content-type: application/json\r\n"
        self.idle: list[RawConnection] = []
        self.slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def call(self, method: str, path: str, body: object, expect: int) -> bytes:
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\n{self.headers}content-length: {len(payload)}\r\n\r\n".encode()
        async with self.slots:
            connection = await self.connection()
            try:
                status, answer = await connection.request(head, payload)
            except BaseException:
                connection.close()
                raise
            self.idle.append(connection)
        if status != expect:
            raise RuntimeError(f"{method} {path} answered {status}: {answer[:300]!r}")
        return answer

    async def connection(self) -> RawConnection:
        """An idle connection the server has not closed (it does after 75 s idle), else a new one."""
        while self.idle:
            connection = self.idle.pop()
            if not connection.reader.at_eof():
                return connection
            connection.close()
        if self.socket is not None:
            return RawConnection(*await asyncio.open_unix_connection(self.socket))
        return RawConnection(*await asyncio.open_connection(self.host, self.port))

    async def claim(self, pool: str) -> Any:
        return json.loads(await self.call("POST", "/v1/sandboxes", {"warmpool": pool}, 201))["id"]

    async def run(self, handle: Any, command: str | list[str], isolated: bool = False) -> tuple[int | None, str]:
        body = {"command": command, "isolated": True} if isolated else {"command": command}
        result = json.loads(await self.call("POST", f"/v1/sandboxes/{handle}/exec", body, 200))
        return result["exit_code"], result["stdout"]

    async def delete(self, handle: Any) -> None:
        await self.call("DELETE", f"/v1/sandboxes/{handle}", None, 204)

    async def connect(self, count: int) -> None:
        await asyncio.gather(*(self.call("GET", "/healthz", None, 200) for _ in range(count)))

    async def close(self) -> None:
        for connection in self.idle:
            connection.close()


# -- driving them ----------------------------------------------------------------------------

async def timed(action: Awaitable[Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await action
    return (time.perf_counter() - start) * 1000, result


async def workers(count: int, each: int, step: Callable[[], Awaitable[None]]) -> None:
    """`count` concurrent clients, each doing `step` `each` times in a row."""
    async def worker() -> None:
        for _ in range(each):
            await step()

    await asyncio.gather(*(worker() for _ in range(count)))


async def bounded(actions: list[Awaitable[Any]], limit: int = 64) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(action: Awaitable[Any]) -> Any:
        async with gate:
            return await action

    return await asyncio.gather(*(one(action) for action in actions))


async def succeed(client: Client, handle: Any, command: str | list[str], isolated: bool = False) -> str:
    code, stdout = await client.run(handle, command, isolated)
    if code != 0:
        raise RuntimeError(f"{command!r} exited with {code} in sandbox {handle}")
    return stdout


async def release(client: Client, handles: list[Any]) -> None:
    await bounded([client.delete(handle) for handle in handles])
