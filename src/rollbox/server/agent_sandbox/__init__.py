"""agent-sandbox's own Python client, unmodified, against rollbox: the part of the Kubernetes API it uses
(SandboxClaims, Sandboxes, discovery) and the sandbox router's data plane, over any `Node`.

`rollbox kubeconfig` writes the kubeconfig that points the client's Kubernetes calls here; its
`SandboxDirectConnectionConfig(api_url=...)` points the data plane here too (docs/compat-agent-sandbox.md).
Neither is part of rollbox's own API, so neither is in its OpenAPI document.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from rollbox.node import Node
from rollbox.server.agent_sandbox.claims import Claims
from rollbox.server.agent_sandbox.dataplane import DataPlane
from rollbox.server.agent_sandbox.kube import KubernetesApi
from rollbox.server.auth import ClusterSecret, Tenants


class Facade:
    """Serves the Kubernetes API's paths (`/api`, `/apis/...`) and the data plane's; passes the rest to `app`."""

    def __init__(self, app: ASGIApp, node: Node, tenants: Tenants | ClusterSecret) -> None:
        claims = Claims(node)
        self.kubernetes = KubernetesApi(claims, tenants).router
        self.app = DataPlane(app, node, claims, tenants)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path in ("/api", "/apis") or path.startswith(("/api/", "/apis/"))):
            await self.kubernetes(scope, receive, send)
        else:
            await self.app(scope, receive, send)
