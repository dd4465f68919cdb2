"""Bearer tokens to tenants, and which tenants administer the server.

With no tokens configured, every caller is the tenant `default`, which is then the admin.
Templates and warm pools belong to the admins: a template decides what code every sandbox made
from it runs, and its `copy` steps and `oci:` bases read the server's own files, so a tenant
allowed to apply one could plant code in other tenants' sandboxes or read the host.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from rollbox.errors import Forbidden, InvalidRequest, Unauthorized

OPEN_TENANT = "default"


class Tenants:
    """Looks tokens up by their SHA-256, so the comparison takes the same time for every wrong token."""

    def __init__(self, tokens: dict[str, str] | None = None, admins: Iterable[str] = ()) -> None:
        """`tokens` maps each tenant to its token (the CLI's `--token TENANT=TOKEN`); `admins` names the
        tenants that may apply and delete templates and warm pools (`--admin TENANT`)."""
        self.open = not tokens
        self._tenants: dict[bytes, str] = {}
        for tenant, token in (tokens or {}).items():
            if not token:
                raise InvalidRequest(f"tenant {tenant!r} has an empty token: give every tenant a token")
            digest = _digest(token)
            if digest in self._tenants:
                raise InvalidRequest(f"tenants {self._tenants[digest]!r} and {tenant!r} share a token: "
                                     "give each its own")
            self._tenants[digest] = tenant
        admins = frozenset(admins)
        if self.open and admins:
            raise InvalidRequest("admins need tokens: an open server has one tenant, which is its admin")
        missing = sorted(admins - set(tokens or {}))
        if missing:
            raise InvalidRequest(f"admin {missing[0]!r} has no token: give it one (--token {missing[0]}=TOKEN)")
        self.admins = frozenset({OPEN_TENANT}) if self.open else admins

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

    def require_admin(self, tenant: str) -> None:
        if tenant not in self.admins:
            raise Forbidden(f"tenant {tenant!r} may not change templates or warm pools: use an admin's token "
                            "(the server's operator names admins with `rollbox serve --admin TENANT`)")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
