"""Bearer tokens to tenants, and which tenants administer the server; or, on a node agent, the cluster secret.

With no tokens configured, every caller is the tenant `default`, which is then the admin.
Templates and warm pools belong to the admins: a template decides what code every sandbox made
from it runs, and its `copy` steps and `oci:` bases read the server's own files, so a tenant
allowed to apply one could plant code in other tenants' sandboxes or read the host.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from rollbox.errors import Forbidden, InvalidRequest, Unauthorized

OPEN_TENANT = "default"
MIN_SECRET = 16
"""Characters a cluster secret has at least."""
TENANT_HEADER = "x-rollbox-tenant"
"""Names the tenant a router acts for, in its calls to a node agent."""


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
        self.names = frozenset({OPEN_TENANT}) if self.open else frozenset(self._tenants.values())
        """Every tenant: whose sandboxes an admin's dashboard lists."""

    def tenant(self, authorization: str | None, acting_for: str | None = None) -> str:
        """The tenant of an `Authorization` header's value (`acting_for` counts only on a node agent)."""
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


class SandboxTokens:
    """Tokens that open one sandbox of one tenant, for one purpose: `<tenant>:<HMAC-SHA256 of the sandbox id, keyed
    by the SHA-256 of the tenant's token>` (the purpose, when there is one, is mixed into the message). They are
    checked without any state, so every router replica with the same tokens accepts them and a restart keeps them
    valid; they end with their sandbox (ids are never reused) or when the tenant's token changes. On an open server
    they are made with a fixed key: there every caller is the one tenant anyway."""

    OPEN_KEY = hashlib.sha256(b"rollbox-open-server").digest()

    def __init__(self, tokens: dict[str, str] | None, purpose: str = "") -> None:
        self.open = not tokens
        self._purpose = f"{purpose}:" if purpose else ""
        self._keys = {tenant: _digest(token) for tenant, token in (tokens or {}).items()}

    def token(self, tenant: str, sandbox_id: str) -> str:
        return f"{tenant}:{self._mac(tenant, sandbox_id)}"

    def holder(self, token: str | None, sandbox_id: str) -> str | None:
        """The tenant `token` opens `sandbox_id` for, or None when it opens nothing there."""
        if self.open:
            return OPEN_TENANT
        tenant, _, mac = (token or "").rpartition(":")
        if tenant not in self._keys or not hmac.compare_digest(mac, self._mac(tenant, sandbox_id)):
            return None
        return tenant

    def _mac(self, tenant: str, sandbox_id: str) -> str:
        key = self.OPEN_KEY if self.open else self._keys[tenant]
        return hmac.new(key, (self._purpose + sandbox_id).encode(), hashlib.sha256).hexdigest()


class ClusterSecret:
    """A node agent's callers: routers holding the cluster secret, each call acting for the tenant it names
    (TENANT_HEADER). The router has authenticated that tenant and checked its admin rights, so here every
    caller with the secret may do what any tenant may."""

    def __init__(self, secret: str) -> None:
        if len(secret) < MIN_SECRET:
            raise InvalidRequest(f"the cluster secret has {len(secret)} characters: give at least {MIN_SECRET} "
                                 "(for instance `openssl rand -hex 32`)")
        self._digest = _digest(secret)
        self.open = False

    def tenant(self, authorization: str | None, acting_for: str | None = None) -> str:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(_digest(token.strip()), self._digest):
            raise Unauthorized("a node agent answers only its cluster's routers: send the cluster secret")
        if not acting_for:
            raise Unauthorized(f"say which tenant the call is for in the {TENANT_HEADER} header")
        return acting_for

    def require_admin(self, tenant: str) -> None:
        """The router checked."""
