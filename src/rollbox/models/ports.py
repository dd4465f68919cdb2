"""The wire shapes of ports into a sandbox (docs/ports.md)."""

from __future__ import annotations

from pydantic import BaseModel

TRAFFIC_TOKEN_HEADER = "X-Rollbox-Traffic-Token"
"""The header a request to a sandbox's port carries its traffic token in (instead of the tenant's token)."""


class TrafficToken(BaseModel):
    """Opens the sandbox's ports to whoever holds it, and nothing else: give it to a browser or a tool instead of
    the tenant's token. It ends with the sandbox."""

    sandbox_id: str
    token: str
    header: str = TRAFFIC_TOKEN_HEADER
