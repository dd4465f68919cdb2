"""Capability URLs: an app served only under a secret first path segment, for clients that send no token.

SandboxFusion's clients (verl's reward, the `sandbox-fusion` package) send no credentials. A gateway for
them on a TCP port holds a router token, so without a secret any user of the machine who reaches the port
would run code with that token. The key travels in the endpoint URL the operator gives the trainer, as a
token would in a header.
"""

from __future__ import annotations

import hmac
import re
import secrets

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rollbox.errors import InvalidRequest

MIN_KEY_LENGTH = 16
_KEY = re.compile(r"[A-Za-z0-9_-]+")


def new_key() -> str:
    """A random key: 32 URL-safe characters (192 bits)."""
    return secrets.token_urlsafe(24)


class SecretPath:
    """Serves `app` under `/<key>` only (as if mounted there); any other path answers 404 without reaching it.

    The key is compared in constant time, so answer times do not reveal how much of a guess was right.
    """

    def __init__(self, app: ASGIApp, key: str) -> None:
        if len(key) < MIN_KEY_LENGTH or not _KEY.fullmatch(key):
            raise InvalidRequest(f"the key must have at least {MIN_KEY_LENGTH} characters, all letters, digits, "
                                 "'-' or '_': leave it out to get a random one")
        self.app = app
        self._key = key.encode()
        self._root = f"/{key}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        segment = scope["path"][1:].partition("/")[0]
        if not hmac.compare_digest(segment.encode(), self._key):
            if scope["type"] == "http":
                await JSONResponse({"detail": "Not Found"}, status_code=404)(scope, receive, send)
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": ""})
            return
        await self.app({**scope, "root_path": scope.get("root_path", "") + self._root}, receive, send)
