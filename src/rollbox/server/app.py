"""The ASGI app: auth, error shapes, body limits, operations routes, and the resource routes."""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from rollbox import __version__
from rollbox.errors import InvalidRequest, NotFound, RollboxError
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


def create_app(node: Node, tokens: dict[str, str] | None = None, *, max_body: int = DEFAULT_MAX_BODY) -> Starlette:
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

    return Starlette(routes=routes.starlette(), middleware=[Middleware(BodyLimit, limit=max_body)],
                     exception_handlers=_error_handlers(metrics))


def _error_handlers(metrics: Metrics) -> dict:
    """Every error answers `{"error": {"code", "message"}}`; client mistakes are 4xx, never 500."""

    def fail(code: str, message: str, status: int) -> Response:
        metrics.failures.labels(code).inc()
        return json_response(error_body(code, message), status)

    async def rollbox_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, RollboxError)
        if error.status >= 500:
            log.error("request failed", exc_info=error)
        return fail(error.code, str(error), error.status)

    async def http_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if error.status_code == 404:
            return fail(NotFound.code, "no such route: see docs/api.md or /openapi.json", 404)
        return fail(InvalidRequest.code, str(error.detail), error.status_code)

    async def unexpected(_: Request, error: Exception) -> Response:
        log.error("request failed", exc_info=error)
        return fail(RollboxError.code, f"the server failed: {error}; see its log", 500)

    return {RollboxError: rollbox_error, HTTPException: http_error, Exception: unexpected}
