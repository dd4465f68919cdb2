"""A port of a sandbox on another machine: a WebSocket tunnel to the node agent that holds it
(`/v1/sandboxes/{id}/tunnel/{port}`, server/ports), carrying the port's bytes as binary messages. So a cluster's
router passes HTTP and WebSockets to a sandbox's server exactly as one machine's server does, over `Node.open_port`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from urllib.parse import urlsplit

import httpx

from rollbox.errors import NodeUnavailable, RollboxError, from_code
from rollbox.node.ports import CHUNK, SocketStream
from rollbox.server.auth import TENANT_HEADER
from rollbox.server.ports.websocket import Rejected, WebSocketClient

CONNECT_TIMEOUT = 5.0


class TunnelStream:
    """A `PortStream` over the tunnel: an empty message ends one direction, a close ends both."""

    def __init__(self, client: WebSocketClient) -> None:
        self._client = client
        self._ended = False

    async def read(self) -> bytes:
        if self._ended:
            return b""
        received = await self._client.receive()
        if isinstance(received, int) or not received:
            self._ended = True
            return b""
        return received if isinstance(received, bytes) else received.encode()

    async def write(self, data: bytes) -> None:
        if data:
            await self._client.send(data)

    async def write_eof(self) -> None:
        await self._client.send(b"")

    async def close(self) -> None:
        await self._client.close()
        await self._client.stream.close()


async def open_tunnel(url: str, secret: str, tenant: str, sandbox_id: str, port: int) -> TunnelStream:
    """The tunnel to `port` of `sandbox_id` at the node agent `url`, for `tenant`. httpx.ConnectError when nothing
    listens there (the node agent restarts: the caller waits for it), the node's own error when it refuses."""
    address = urlsplit(url)
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            if address.scheme == "unix":
                reader, writer = await asyncio.open_unix_connection(address.path, limit=CHUNK)
            else:
                reader, writer = await asyncio.open_connection(address.hostname, address.port or 80, limit=CHUNK)
    except (OSError, TimeoutError) as error:
        raise httpx.ConnectError(f"node agent {url}: {error}") from None
    client = WebSocketClient(SocketStream(reader, writer, _nothing))
    headers = [(b"authorization", f"Bearer {secret}".encode()), (TENANT_HEADER.encode(), tenant.encode())]
    try:
        await client.open(address.netloc or "node", f"/v1/sandboxes/{sandbox_id}/tunnel/{port}", headers, [])
    except Rejected as rejected:
        await client.stream.close()
        raise _error(*rejected.answer) from None
    except BaseException:
        with contextlib.suppress(Exception):
            await client.stream.close()
        raise
    return TunnelStream(client)


def _error(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> RollboxError:
    """The node agent's refusal as the error it stands for."""
    try:
        error = json.loads(body)["error"]
        return from_code(error["code"], error["message"])
    except (ValueError, KeyError, TypeError):
        return NodeUnavailable(f"the sandbox's node refused the tunnel with status {status}")


def _nothing() -> None:
    """The tunnel's own connection holds no claim here: the node agent counts its use."""
