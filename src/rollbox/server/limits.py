"""A cap on request bodies, enforced before anything reads one into memory."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollbox.errors import InvalidRequest, RollboxError, TooLarge
from rollbox.server.responses import error_response


class BodyLimit:
    """Answers 413 `too_large` to bodies over `limit` bytes, declared (Content-Length) or streamed (chunked)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        try:
            if length is not None:
                if not length.isdigit():
                    raise InvalidRequest("Content-Length must be a number of bytes")
                if int(length) > self.limit:
                    raise self._too_large()
            elif b"transfer-encoding" in headers:
                receive = await self._buffered(receive)
        except RollboxError as error:
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _buffered(self, receive: Receive) -> Receive:
        """Reads a streamed body up to the limit, then replays it to the app."""
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                raise self._too_large()
            if not message.get("more_body"):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        return replay

    def _too_large(self) -> TooLarge:
        return too_large(self.limit)


def too_large(limit: int) -> TooLarge:
    """The answer to a body over `limit` bytes (also the router's edge's, rollbox/cluster/edge.py)."""
    return TooLarge(f"the request body is over the server's limit of {limit} bytes: send less "
                    "(for big trees, several archives)")
