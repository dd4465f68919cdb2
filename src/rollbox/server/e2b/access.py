"""Who calls: E2B's API key is a rollbox token; the daemon's access token names one tenant's one sandbox.

The SDK sends its API key (`X-API-KEY`) only to the REST API. Calls to the in-sandbox daemon carry the
sandbox id (`E2b-Sandbox-Id`) and the access token the REST API gave out with the sandbox
(`X-Access-Token`), a `SandboxTokens` token: it opens that one sandbox only. Traffic to the sandbox's ports
carries its traffic token (`e2b-traffic-access-token`), rollbox's own (docs/ports.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from rollbox.errors import Unauthorized
from rollbox.server.auth import SandboxTokens, Tenants
from rollbox.server.ports import TRAFFIC


class Access:
    def __init__(self, tokens: dict[str, str] | None, admins: Iterable[str] = ()) -> None:
        self.tenants = Tenants(tokens, admins)
        self.daemon = SandboxTokens(tokens)
        """The daemon's access tokens (made without a purpose, as since the first release: tokens given out then
        stay valid)."""
        self.traffic = SandboxTokens(tokens, TRAFFIC)

    def tenant(self, api_key: str | None) -> str:
        """The tenant of an `X-API-KEY` value."""
        if not api_key and not self.tenants.open:
            raise Unauthorized("send a rollbox token as the E2B API key (E2B_API_KEY or api_key=...)")
        return self.tenants.tenant(f"Bearer {api_key}")

    def token(self, tenant: str, sandbox_id: str) -> str:
        """The daemon's access token for one sandbox of `tenant`."""
        return self.daemon.token(tenant, sandbox_id)

    def holder(self, access_token: str | None, sandbox_id: str) -> str | None:
        """The tenant an access token opens `sandbox_id` for, or None when it opens nothing there."""
        return self.daemon.holder(access_token, sandbox_id)
