"""The ASGI app: auth, error shapes, body limits, operations routes, and the resource routes."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterable

from starlette.responses import Response
from starlette.types import ASGIApp

from rollbox._version import __version__
from rollbox.node import Node
from rollbox.server import agent_sandbox, e2b, images, leases, openapi, ports, processes, resources, sandboxes
from rollbox.server.auth import ClusterSecret, SandboxTokens, Tenants
from rollbox.server.dashboard import routes as dashboard
from rollbox.server.failures import logged
from rollbox.server.limits import BodyLimit
from rollbox.server.metrics import Metrics
from rollbox.server.ports import DEFAULT_DOMAINS, TRAFFIC, Ports
from rollbox.server.responses import error_response, json_response
from rollbox.server.routing import Routes
from rollbox.server.volumes import add_routes as add_volume_routes

log = logging.getLogger("rollbox.server")

DEFAULT_MAX_BODY = 256 * 2**20
YOUNG_OBJECTS = 10_000
"""Net new container objects between two collections of the youngest generation (Python's default: 700)."""
DESCRIPTION = "Isolated, stateful sandboxes for RL training of code agents. The contract is docs/api.md."


Failure = Callable[[Exception], Response]
"""Turns whatever a request raised into its answer (and counts it)."""
Front = Callable[[ASGIApp, Metrics, Tenants | ClusterSecret, Failure], ASGIApp]
"""A layer that serves some calls before the API's routes, counting them in its metrics and answering their errors
as the routes do (a router's forwarding)."""


def create_app(node: Node, tokens: dict[str, str] | None = None, *, admins: Iterable[str] = (),
               max_body: int = DEFAULT_MAX_BODY, cluster_secret: str | None = None,
               front: Front | None = None, metrics: Metrics | None = None,
               sandbox_domains: tuple[str, ...] = DEFAULT_DOMAINS, in_cluster: bool = False) -> ASGIApp:
    """The HTTP API of docs/api.md over `node`; `tokens` maps tenants to bearer tokens (None: open), and
    `admins` names the tenants that may change templates and warm pools. With `cluster_secret` it is a node
    agent's API instead: only routers holding the secret may call, each call acting for a tenant it names.
    `front` wraps the routes, inside the body limit. `metrics`: the caller's, to count what it serves besides.
    `sandbox_domains`: where `{port}-{sandbox_id}.<domain>` addresses a sandbox's port (docs/ports.md); `in_cluster`
    serves agent-sandbox's pod addresses without a token (server/agent_sandbox/pods.py)."""
    metrics = Metrics() if metrics is None else metrics
    routes = Routes(ClusterSecret(cluster_secret) if cluster_secret is not None else Tenants(tokens, admins))
    sandboxes.add_routes(routes, node, metrics)
    processes.add_routes(routes, node)
    resources.add_routes(routes, node)
    images.add_routes(routes, node)
    add_volume_routes(routes, node)
    leases.add_routes(routes, node)
    dashboard.add_routes(routes, node, metrics.activity)
    traffic = SandboxTokens(tokens, TRAFFIC)
    if cluster_secret is None:  # a node agent's router holds the tokens
        ports.add_routes(routes, node, traffic)

    @routes.add("GET", "/healthz", auth=False)
    async def healthz() -> Response:
        """{"status": "ok", "sandboxes": n, "max_sandboxes": n, "claims": n, "pools": {...}}; needs no token."""
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

    fail = _failure(metrics)
    app: ASGIApp = routes.app(fail, _settle_collector)
    if cluster_secret is None:  # E2B's SDK, unmodified, on the router (docs/compat-e2b.md)
        app = e2b.Facade(app, node, tokens, admins, sandbox_domains)
        app = agent_sandbox.Facade(app, node, routes.tenants, in_cluster)  # its client (docs/compat-agent-sandbox.md)
        app = Ports(app, node, routes.tenants, traffic, sandbox_domains)
    else:
        app = Ports(app, node, routes.tenants, None, ())
    if front is not None:
        app = front(app, metrics, routes.tenants, fail)
    return BodyLimit(app, max_body)


def _settle_collector() -> None:
    """Tunes the cyclic garbage collector for serving, as the server starts.

    What exists by then (modules, pydantic's schemas, the node) lives as long as the process: frozen
    out of the collector, a full collection walks only what requests made, not the whole process. A
    request frees nearly all it allocates by reference counting, so the youngest generation is
    collected after YOUNG_OBJECTS net allocations instead of 700, the default, at which collections
    cost a measurable share of each request (docs/design-notes.md).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, *gc.get_threshold()[1:])


def _failure(metrics: Metrics) -> Failure:
    """Every error answers `{"error": {"code", "message"}}`; client mistakes are 4xx, never 500. Only what is
    unexpected is logged with its traceback (failures.py)."""

    def fail(error: Exception) -> Response:
        answered = logged(error, log, "a request")
        metrics.failures.labels(answered.code).inc()
        return error_response(answered)

    return fail
