"""E2B's SDK, unmodified, against rollbox: its REST API and its in-sandbox daemon, served by the router.

Point the SDK's API URL and sandbox URL at the router and give a rollbox token as its API key
(docs/compat-e2b.md). The facade answers the paths the SDK calls and hands every other request to the
rollbox API beneath it, so it serves over any `Node`: a local one or a cluster's router.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.routing import Router, request_response
from starlette.types import ASGIApp, Receive, Scope, Send

from rollbox.node import Node
from rollbox.server.e2b import api, templates
from rollbox.server.e2b.access import Access
from rollbox.server.e2b.envd import Daemon

PREFIXES = ("/sandboxes", "/v2/sandboxes", "/snapshots", "/templates", "/v2/templates", "/v3/templates",
            "/process.Process/", "/filesystem.Filesystem/")
PATHS = frozenset({"/files", "/health"})
"""The paths the SDK calls (these and those under PREFIXES); none is a path of rollbox's own API."""


class Facade:
    """Serves the SDK's paths; passes everything else to `app`."""

    def __init__(self, app: ASGIApp, node: Node, tokens: dict[str, str] | None, admins: Iterable[str] = (),
                 domains: tuple[str, ...] = ("localhost",)) -> None:
        self.app = app
        access = Access(tokens, admins)
        # the builds' routes first: DELETE /templates/tags is theirs, not a snapshot's
        routes = templates.routes(node, access) + api.routes(node, access, domains) + Daemon(node, access).routes()
        self.router = Router(routes, default=request_response(api.not_served))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] in PATHS or scope["path"].startswith(PREFIXES)):
            await self.router(scope, receive, send)
        else:
            await self.app(scope, receive, send)
