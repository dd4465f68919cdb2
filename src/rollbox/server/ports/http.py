"""One HTTP request passed to a server inside a sandbox and its answer passed back, over a `PortStream`, with h11
speaking HTTP/1.1 to the server. The answer streams as the server sends it (server-sent events, a long download),
and the request's body streams to the server as the client sends it."""

from __future__ import annotations

import h11
from starlette.types import Receive, Scope, Send

from rollbox.errors import PortClosed
from rollbox.node.base import PortStream

MAX_HEAD = 1 << 16
"""Bytes of a response's status line and headers at most."""
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"host"})
"""Headers that concern one hop only (Host is set again for the server)."""

Headers = list[tuple[bytes, bytes]]


def forwarded(headers: Headers, drop: frozenset[bytes] = frozenset()) -> Headers:
    """A request's or answer's headers without the hop-by-hop ones (and those the Connection header names) and
    `drop`."""
    named = {token.strip().lower() for key, value in headers if key == b"connection" for token in value.split(b",")}
    skip = HOP_BY_HOP | named | drop
    return [(key, value) for key, value in headers if key.lower() not in skip]


async def proxy_http(scope: Scope, receive: Receive, send: Send, stream: PortStream, target: str,
                     headers: Headers) -> None:
    """Sends the request to the server and its answer to the client; PortClosed when the server answered nothing."""
    connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    try:
        sent = await _request(scope, receive, stream, target, headers, connection)
    except (OSError, ConnectionError):
        raise PortClosed("the sandbox's server closed the connection before it read the request") from None
    if sent:
        await _answer(connection, stream, send)


async def _request(scope: Scope, receive: Receive, stream: PortStream, target: str, headers: Headers,
                   connection: h11.Connection) -> bool:
    """Sends the request; False when the client went away before its body was whole."""
    original = dict(scope["headers"])
    host = original.get(b"host", b"localhost")
    framing: Headers = [(b"transfer-encoding", b"chunked")] if (
        b"transfer-encoding" in original and b"content-length" not in original) else []
    await stream.write(connection.send(h11.Request(method=scope["method"], target=target.encode("latin-1"),
                                                   headers=[(b"host", host), *headers, *framing])))
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        body = message.get("body", b"")
        if body:
            await stream.write(connection.send(h11.Data(data=body)))
        if not message.get("more_body", False):
            break
    await stream.write(connection.send(h11.EndOfMessage()))
    return True


async def _answer(connection: h11.Connection, stream: PortStream, send: Send) -> None:
    started = False
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError as error:
            if not started:
                raise PortClosed(f"the sandbox's server did not answer in HTTP/1.1: {error}") from None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.read())
            continue
        if isinstance(event, h11.InformationalResponse):
            continue  # 100 Continue and the like: the client's server sends its own
        if isinstance(event, h11.Response):
            await send({"type": "http.response.start", "status": event.status_code,
                        "headers": forwarded(list(event.headers))})
            started = True
        elif isinstance(event, h11.Data):
            await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            if not started:
                raise PortClosed("the sandbox's server closed the connection without answering")
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
