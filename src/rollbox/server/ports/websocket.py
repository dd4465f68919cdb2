"""WebSockets through the router: a client's WebSocket passed to a server inside a sandbox message by message, and
the tunnel that carries a port's raw bytes as binary messages (between a cluster's router and the node agent that
holds the sandbox, or for a client of rollbox's own).

`WebSocketClient` speaks the client's side of the protocol (wsproto, which keeps no socket of its own) over any
`PortStream`: the sandbox's port for a proxied WebSocket, a TCP connection to a node agent for a tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.types import Receive, Scope, Send
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from rollbox.errors import PortClosed
from rollbox.node.base import PortStream

MAX_MESSAGE = 16 * 2**20
"""Bytes one message may hold (a larger one closes the WebSocket with 1009), as uvicorn's own limit."""


class Rejected(PortClosed):
    """The server answered the WebSocket's opening handshake with a plain HTTP answer (an error, a redirect)."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        super().__init__(f"the sandbox's server refused the WebSocket with status {status}")
        self.answer = (status, headers, body)


class WebSocketClient:
    """The client's side of one WebSocket over `stream`."""

    def __init__(self, stream: PortStream) -> None:
        self.stream = stream
        self._ws = WSConnection(ConnectionType.CLIENT)
        self._pending: list[Any] = []
        self._parts: list[bytes | str] = []
        self.subprotocol: str | None = None

    async def open(self, host: str, target: str, headers: list[tuple[bytes, bytes]],
                   subprotocols: list[str]) -> None:
        """The opening handshake; PortClosed when the server refuses it (with its status) or is not one."""
        await self.stream.write(self._ws.send(Request(host=host, target=target, subprotocols=subprotocols,
                                                      extra_headers=headers)))
        while True:
            event = await self._event()
            if isinstance(event, AcceptConnection):
                self.subprotocol = event.subprotocol
                return
            if isinstance(event, RejectConnection):
                body = b""
                while event.has_body:
                    data = await self._event()
                    if not isinstance(data, RejectData):
                        break
                    body += data.data
                    if data.body_finished:
                        break
                raise Rejected(event.status_code, list(event.headers), body)
            if event is None:
                raise PortClosed("the sandbox's server closed the connection during the WebSocket handshake")

    async def send(self, data: bytes | str) -> None:
        await self.stream.write(self._ws.send(Message(data=data)))

    async def receive(self) -> bytes | str | int:
        """The next whole message, or the close code once the server closed (1006: without a close frame)."""
        while True:
            event = await self._event()
            if event is None:
                return 1006
            if isinstance(event, Ping):
                await self.stream.write(self._ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                with contextlib.suppress(LocalProtocolError):
                    await self.stream.write(self._ws.send(event.response()))
                return event.code
            elif isinstance(event, TextMessage | BytesMessage):
                self._parts.append(event.data)
                if sum(len(part) for part in self._parts) > MAX_MESSAGE:
                    await self.close(1009)
                    return 1009
                if event.message_finished:
                    parts, self._parts = self._parts, []
                    return "".join(parts) if isinstance(event, TextMessage) else b"".join(parts)  # type: ignore[arg-type]

    async def close(self, code: int = 1000) -> None:
        with contextlib.suppress(LocalProtocolError, OSError, ConnectionError):
            await self.stream.write(self._ws.send(CloseConnection(code=code)))

    async def _event(self) -> Any:
        while not self._pending:
            try:
                self._pending.extend(self._ws.events())
            except RemoteProtocolError:
                return None
            if self._pending:
                break
            data = await self.stream.read()
            try:
                self._ws.receive_data(data or None)
            except RemoteProtocolError as error:
                raise PortClosed(f"the sandbox's server broke the WebSocket protocol: {error}") from None
        return self._pending.pop(0)


async def proxy_websocket(scope: Scope, receive: Receive, send: Send, stream: PortStream, target: str,
                          headers: list[tuple[bytes, bytes]]) -> None:
    """Opens the WebSocket to the sandbox's server, accepts the client's with the same subprotocol, and passes the
    messages both ways until either side closes."""
    host = dict(scope["headers"]).get(b"host", b"localhost").decode("latin-1")
    headers = [(key, value) for key, value in headers if not key.lower().startswith(b"sec-websocket-")]
    upstream = WebSocketClient(stream)
    if (await receive())["type"] != "websocket.connect":
        return
    try:
        await upstream.open(host, target, headers, list(scope.get("subprotocols", [])))
    except Rejected as rejected:
        if "websocket.http.response" not in scope.get("extensions", {}):
            raise
        status, answer_headers, body = rejected.answer
        await send({"type": "websocket.http.response.start", "status": status, "headers": answer_headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})

    async def from_client() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(message.get("code", 1000))
                return
            data = message.get("text") if message.get("text") is not None else message.get("bytes")
            if data is not None:
                await upstream.send(data)

    async def from_server() -> None:
        while True:
            received = await upstream.receive()
            if isinstance(received, int):
                await send({"type": "websocket.close", "code": 1000 if received == 1005 else received})
                return
            key = "text" if isinstance(received, str) else "bytes"
            await send({"type": "websocket.send", key: received})

    try:
        await _either(from_client(), from_server())
    except (OSError, ConnectionError, PortClosed):
        with contextlib.suppress(Exception):
            await send({"type": "websocket.close", "code": 1011})


async def tunnel(receive: Receive, send: Send, stream: PortStream) -> None:
    """A port's raw bytes as binary messages; an empty message ends one direction (a half close), so a request and
    its answer can be told apart from the connection's end."""
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept", "subprotocol": None})

    async def from_client() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes") or (message.get("text") or "").encode()
            if not data:
                await stream.write_eof()
                await asyncio.Event().wait()  # the other direction goes on
            await stream.write(data)

    async def from_server() -> None:
        while data := await stream.read():
            await send({"type": "websocket.send", "bytes": data})
        await send({"type": "websocket.send", "bytes": b""})
        await asyncio.Event().wait()  # until the client closes

    with contextlib.suppress(OSError, ConnectionError):
        await _either(from_client(), from_server())
    with contextlib.suppress(Exception):
        await send({"type": "websocket.close", "code": 1000})


async def _either(*work: Any) -> None:
    """Runs both directions until one ends, then stops the other."""
    tasks = [asyncio.ensure_future(job) for job in work]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
