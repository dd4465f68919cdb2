"""Who calls: E2B's API key is a rollbox token; the daemon's access token names one tenant's one sandbox.

The SDK sends its API key (`X-API-KEY`) only to the REST API. Calls to the in-sandbox daemon carry the
sandbox id (`E2b-Sandbox-Id`) and the access token the REST API gave out with the sandbox
(`X-Access-Token`), which is `<tenant>:<HMAC of the sandbox id keyed by the tenant's token>`. It is checked
without any state, so every router replica with the same tokens accepts it and a restart keeps it valid,
and it opens that one sandbox only.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from rollbox.errors import Unauthorized
from rollbox.server.auth import OPEN_TENANT, Tenants

OPEN_KEY = hashlib.sha256(b"rollbox-open-server").digest()


class Access:
    def __init__(self, tokens: dict[str, str] | None, admins: Iterable[str] = ()) -> None:
        self.tenants = Tenants(tokens, admins)
        self._keys = {tenant: hashlib.sha256(token.encode()).digest() for tenant, token in (tokens or {}).items()}

    def tenant(self, api_key: str | None) -> str:
        """The tenant of an `X-API-KEY` value."""
        if not api_key and not self.tenants.open:
            raise Unauthorized("send a rollbox token as the E2B API key (E2B_API_KEY or api_key=...)")
        return self.tenants.tenant(f"Bearer {api_key}")

    def token(self, tenant: str, sandbox_id: str) -> str:
        """The daemon's access token for one sandbox of `tenant`."""
        return f"{tenant}:{self._mac(tenant, sandbox_id)}"

    def holder(self, access_token: str | None, sandbox_id: str) -> str | None:
        """The tenant an access token opens `sandbox_id` for, or None when it opens nothing there."""
        if self.tenants.open:
            return OPEN_TENANT
        tenant, _, mac = (access_token or "").rpartition(":")
        if tenant not in self._keys or not hmac.compare_digest(mac, self._mac(tenant, sandbox_id)):
            return None
        return tenant

    def _mac(self, tenant: str, sandbox_id: str) -> str:
        key = OPEN_KEY if self.tenants.open else self._keys[tenant]
        return hmac.new(key, sandbox_id.encode(), hashlib.sha256).hexdigest()
