"""The FastAPI app: auth, error shapes, body limits, operations routes, and the resource routers."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.responses import Response

from rollbox import __version__
from rollbox.errors import InvalidRequest, NotFound, RollboxError
from rollbox.node import Node
from rollbox.server import resources, sandboxes
from rollbox.server.auth import Tenants
from rollbox.server.limits import BodyLimit
from rollbox.server.metrics import Metrics
from rollbox.server.responses import error_body, json_response

log = logging.getLogger("rollbox.server")

DEFAULT_MAX_BODY = 256 * 2**20
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(
    auto_error=False, description="A tenant's token; not needed when the server runs open"))]
"""Declares bearer auth in the OpenAPI document; `Tenants` does the checking."""


def create_app(node: Node, tokens: dict[str, str] | None = None, *, max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    """The HTTP API of docs/api.md over `node`; `tokens` maps tenants to bearer tokens (None: open)."""
    tenants = Tenants(tokens)
    metrics = Metrics()

    async def tenant(request: Request, _: Bearer) -> str:
        return tenants.tenant(request.headers.get("authorization"))

    app = FastAPI(title="rollbox", version=__version__, docs_url=None, redoc_url=None,
                  description="Isolated, stateful sandboxes for RL training of code agents (see docs/api.md).")
    app.include_router(sandboxes.router(node, metrics, tenant))
    app.include_router(resources.router(node, tenant))
    _install_error_handlers(app, metrics)
    app.add_middleware(BodyLimit, limit=max_body)

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok", **await node.health()})

    @app.get("/metrics", response_class=Response)
    async def metrics_text() -> Response:
        return Response(metrics.render(await node.health()), media_type="text/plain; version=0.0.4")

    return app


def _install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Every error answers `{"error": {"code", "message"}}`; client mistakes are 4xx, never 500."""

    def fail(code: str, message: str, status: int) -> Response:
        metrics.failures.labels(code).inc()
        return json_response(error_body(code, message), status)

    async def rollbox_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, RollboxError)
        if error.status >= 500:
            log.error("request failed", exc_info=error)
        return fail(error.code, str(error), error.status)

    async def invalid(_: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        problems = "; ".join(f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in error.errors())
        return fail(InvalidRequest.code, f"invalid request: {problems}", 422)

    async def http_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        if error.status_code == 404:
            return fail(NotFound.code, "no such route: see docs/api.md or /openapi.json", 404)
        return fail(InvalidRequest.code, str(error.detail), error.status_code)

    async def unexpected(_: Request, error: Exception) -> Response:
        log.error("request failed", exc_info=error)
        return fail(RollboxError.code, f"the server failed: {error}; see its log", 500)

    app.add_exception_handler(RollboxError, rollbox_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
