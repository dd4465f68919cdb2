"""agent-sandbox's own Python client, unmodified, against rollbox: the part of the Kubernetes API it uses
(SandboxClaims, Sandboxes, discovery) and the sandbox router's data plane, over any `Node`.

`rollbox kubeconfig` writes the kubeconfig that points the client's Kubernetes calls here; its
`SandboxDirectConnectionConfig(api_url=...)` points the data plane here too. See docs/compat-agent-sandbox.md.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp

from rollbox.node import Node
from rollbox.server.agent_sandbox import kube
from rollbox.server.agent_sandbox.claims import Claims
from rollbox.server.agent_sandbox.dataplane import DataPlane
from rollbox.server.routing import Routes


def add_routes(routes: Routes, node: Node) -> Callable[[ASGIApp], ASGIApp]:
    """Adds the Kubernetes API's routes; returns what puts the data plane in front of the app `routes` make."""
    claims = Claims(node)
    kube.add_routes(routes, claims)
    return lambda app: DataPlane(app, node, claims, routes.tenants)
