"""Bearer tokens to tenants. With no tokens configured, every caller is the tenant `default`."""

from __future__ import annotations

import hashlib

from rollbox.errors import Unauthorized

OPEN_TENANT = "default"


class Tenants:
    """Looks tokens up by their SHA-256, so the comparison takes the same time for every wrong token."""

    def __init__(self, tokens: dict[str, str] | None = None) -> None:
        """`tokens` maps each tenant to its token (the CLI's `--token TENANT=TOKEN`)."""
        self.open = not tokens
        self._tenants: dict[bytes, str] = {}
        for tenant, token in (tokens or {}).items():
            if not token:
                raise ValueError(f"tenant {tenant!r} has an empty token: give every tenant a token")
            digest = _digest(token)
            if digest in self._tenants:
                raise ValueError(f"tenants {self._tenants[digest]!r} and {tenant!r} share a token: give each its own")
            self._tenants[digest] = tenant

    def tenant(self, authorization: str | None) -> str:
        """The tenant of an `Authorization` header's value."""
        if self.open:
            return OPEN_TENANT
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("send your token as 'Authorization: Bearer <token>'")
        tenant = self._tenants.get(_digest(token.strip()))
        if tenant is None:
            raise Unauthorized("this token is not known to the server: check the token you were given")
        return tenant


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
