"""The router's and node's side of a trace (rollbox.tracing): a server span per request, the child of the caller's
span by its `traceparent` header, and a span per call on the node under it. Installed only when tracing is on,
so a server without it runs exactly the code it ran before."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rollbox import tracing
from rollbox.node import Node

if TYPE_CHECKING:
    from rollbox.server.routing import Endpoint, RouteSpec

TRACED = frozenset({"apply", "claim", "get", "delete", "exec", "files", "reset", "fork", "pause", "resume", "stats",
                    "snapshot", "delete_snapshot"})
"""The Node calls that get a span of their own."""
LAYERS = {"LocalNode": "node", "ClusterNode": "router"}
"""What a span calls each kind of node: a cluster's router forwards, a node does the work."""


def traced_endpoint(spec: RouteSpec, endpoint: Endpoint) -> Endpoint:
    if not tracing.on:
        return endpoint
    name = f"{spec.method} {spec.path}"
    route = {"http.request.method": spec.method, "http.route": spec.path}

    async def traced(scope: Any, receive: Any, args: dict[str, Any]) -> Any:
        attributes = {**route, "rollbox.sandbox.id": args["sandbox_id"]} if "sandbox_id" in args else route
        with tracing.server_span(name, scope["headers"], attributes) as span:
            response = await endpoint(scope, receive, args)
            span.set_attribute("http.response.status_code", response.status_code)
            return response

    return traced


def traced_node(node: Node) -> Node:
    return TracedNode(node) if tracing.on else node  # type: ignore[return-value]


class TracedNode:
    """A Node whose calls in TRACED are spans (`rollbox.node.exec`, `rollbox.router.claim`, ...); everything
    else is the node's own."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._layer = LAYERS.get(type(node).__name__, type(node).__name__)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._node, name)
        if name not in TRACED:
            return found
        return _spanned(f"rollbox.{self._layer}.{name}", name, found)


def _spanned(span_name: str, operation: str, method: Callable[..., Any]) -> Callable[..., Any]:
    async def call(*args: Any, **options: Any) -> Any:
        attributes = {"rollbox.tenant": args[0]} if args and isinstance(args[0], str) else {}
        if operation not in ("apply", "claim") and len(args) > 1:
            attributes["rollbox.sandbox.id"] = args[1]
        if operation == "files" and len(args) > 2:
            attributes["rollbox.files.op"] = args[2]
        with tracing.span(span_name, attributes) as span:
            result = await method(*args, **options)
            if operation == "claim":
                span.set_attribute("rollbox.sandbox.id", result.id)
            return result

    return call
