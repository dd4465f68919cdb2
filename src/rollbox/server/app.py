"""The ASGI app: auth, error shapes, body limits, operations routes, and the resource routes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp

from rollbox import __version__
from rollbox.errors import RollboxError
from rollbox.node import Node
from rollbox.server import openapi, resources, sandboxes
from rollbox.server.auth import Tenants
from rollbox.server.limits import BodyLimit
from rollbox.server.metrics import Metrics
from rollbox.server.responses import error_body, json_response
from rollbox.server.routing import Routes

log = logging.getLogger("rollbox.server")

DEFAULT_MAX_BODY = 256 * 2**20
DESCRIPTION = "Isolated, stateful sandboxes for RL training of code agents. The contract is docs/api.md."


def create_app(node: Node, tokens: dict[str, str] | None = None, *, max_body: int = DEFAULT_MAX_BODY) -> ASGIApp:
    """The HTTP API of docs/api.md over `node`; `tokens` maps tenants to bearer tokens (None: open)."""
    metrics = Metrics()
    routes = Routes(Tenants(tokens))
    sandboxes.add_routes(routes, node, metrics)
    resources.add_routes(routes, node)

    @routes.add("GET", "/healthz", auth=False)
    async def healthz() -> Response:
        """{"status": "ok", "sandboxes": n, "claims": n, "pools": {...}}; needs no token."""
        return json_response({"status": "ok", **await node.health()})

    @routes.add("GET", "/metrics", answer="text/plain", auth=False)
    async def prometheus() -> Response:
        """Prometheus text: claims, claim latency, pool sizes, execs, failures."""
        return Response(metrics.render(await node.health()), media_type="text/plain; version=0.0.4")

    schema = json_response(openapi.document(routes.specs, "rollbox", __version__, DESCRIPTION))

    @routes.add("GET", "/openapi.json", answer="application/json", auth=False)
    async def openapi_document() -> Response:
        """This document."""
        return schema

    return BodyLimit(routes.app(_failure(metrics)), max_body)


def _failure(metrics: Metrics) -> Callable[[Exception], Response]:
    """Every error answers `{"error": {"code", "message"}}`; client mistakes are 4xx, never 500."""

    def fail(error: Exception) -> Response:
        if not isinstance(error, RollboxError):
            log.error("request failed", exc_info=error)
            error = RollboxError(f"the server failed: {error}; see its log")
        elif error.status >= 500:
            log.error("request failed", exc_info=error)
        metrics.failures.labels(error.code).inc()
        return json_response(error_body(error.code, str(error)), error.status)

    return fail
