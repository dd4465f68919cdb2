"""The router's ASGI app driven in-process by httpx: no socket, no server thread."""

from __future__ import annotations

from typing import Any

import httpx

TOKENS = {"alice": "alice-token", "bob": "bob-token"}
ADMINS = ("alice",)
MAX_BODY = 1024
"""A body limit small enough for a test to go over."""


def client_of(app: Any, token: str | None = None) -> httpx.AsyncClient:
    """An httpx client of `app` (500s come back as answers, as from a real server), sending `token` if given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://rollbox", headers=headers)
