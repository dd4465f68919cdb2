"""agent-sandbox's own Python client, unmodified, against rollbox: the part of the Kubernetes API it uses
(SandboxClaims, Sandboxes, discovery) and the sandbox router's data plane, over any `Node`.

`rollbox kubeconfig` writes the kubeconfig that points the client's Kubernetes calls here; its
`SandboxDirectConnectionConfig(api_url=...)` points the data plane here too (docs/compat-agent-sandbox.md).
Neither is part of rollbox's own API, so neither is in its OpenAPI document.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from rollbox.models import SandboxInfo
from rollbox.node import Node
from rollbox.server.agent_sandbox.claims import Claims
from rollbox.server.agent_sandbox.dataplane import DataPlane
from rollbox.server.agent_sandbox.kube import KubernetesApi
from rollbox.server.agent_sandbox.pods import PodAddresses
from rollbox.server.auth import ClusterSecret, Tenants


class Facade:
    """Serves the Kubernetes API's paths (`/api`, `/apis/...`) and the data plane's; passes the rest to `app`."""

    def __init__(self, app: ASGIApp, node: Node, tenants: Tenants | ClusterSecret, in_cluster: bool = False) -> None:
        """`in_cluster`: serve each sandbox's pod address without a token (pods.py says to whom that opens it)."""
        claims = Claims(node, self._pod_address, self._forget_pod)
        self.kubernetes = KubernetesApi(claims, tenants).router
        self.app = DataPlane(app, node, claims, tenants)
        self.pods = PodAddresses(self.app, in_cluster)

    def _pod_address(self, tenant: str, info: SandboxInfo) -> str:
        return self.pods.address(tenant, info)

    def _forget_pod(self, sandbox_id: str) -> None:
        self.pods.forget(sandbox_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path in ("/api", "/apis") or path.startswith(("/api/", "/apis/"))):
            await self.kubernetes(scope, receive, send)
        else:
            await self.app(scope, receive, send)
