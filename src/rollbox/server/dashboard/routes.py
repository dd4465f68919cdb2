"""The dashboard's routes: its page and files, and the data it reads with the caller's token."""


from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.responses import Response

from rollbox.errors import InvalidRequest, RollboxError
from rollbox.models import SandboxInfo
from rollbox.node import Node
from rollbox.server.auth import Tenants
from rollbox.server.dashboard.assets import Assets
from rollbox.server.dashboard.history import Activity
from rollbox.server.responses import json_response
from rollbox.server.routing import Query, Routes

MAX_STATS = 100
"""Sandboxes whose stats one call reads: the rows a page shows, not the whole node."""


def add_routes(routes: Routes, node: Node, activity: Activity) -> None:
    """Adds the dashboard to a server's routes (not to a node agent's: its callers are routers, not people);
    `activity` is what the server's metrics record of its calls."""
    tenants = routes.tenants
    if not isinstance(tenants, Tenants):
        return
    assets = Assets()
    add = routes.add

    async def visible(tenant: str) -> list[SandboxInfo]:
        """The caller's sandboxes, or every tenant's for an admin."""
        if tenant not in tenants.admins:
            return await node.claims(tenant)
        every = [info for infos in await asyncio.gather(*(node.claims(name) for name in sorted(tenants.names)))
                 for info in infos]
        activity.commands.keep_only({info.id for info in every})
        return every

    @add("GET", "/dashboard", answer="text/html", auth=False)
    async def dashboard_page() -> Response:
        """The dashboard's page (its data routes need a token)."""
        return assets.response("dashboard.html")

    @add("GET", "/dashboard/static/js/{name}", answer="text/javascript", auth=False)
    async def dashboard_script(name: str) -> Response:
        """One of the dashboard's scripts."""
        return assets.response(name, ".js")

    @add("GET", "/dashboard/static/css/{name}", answer="text/css", auth=False)
    async def dashboard_style(name: str) -> Response:
        """The dashboard's styles."""
        return assets.response(name, ".css")

    @add("GET", "/dashboard/api/access", answer="application/json", auth=False)
    async def dashboard_access() -> Response:
        """Whether the data routes need a token, so the page of an open server asks for none. Says no more than
        any route's answer to a call without a token does."""
        return json_response({"token_required": not tenants.open})

    @add("GET", "/dashboard/api/overview", answer="application/json")
    async def dashboard_overview(tenant: str) -> Response:
        """Nodes, warm pools, the caller's sandboxes (an admin's: everyone's) and recent claim and exec latency."""
        health, pools, sandboxes = await asyncio.gather(node.health(), node.warmpools(), visible(tenant))
        return _private({
            "tenant": tenant, "admin": tenant in tenants.admins, "now": time.time(),
            "node": {key: health.get(key) for key in ("node", "sandboxes", "max_sandboxes", "claims")},
            "nodes": health.get("nodes"),
            "pools": [pool.model_dump(include={"name", "template", "ready", "target", "starting", "replicas"})
                      for pool in pools],
            "sandboxes": [info.model_dump(include={"id", "tenant", "state", "template", "warmpool", "created_at",
                                                   "expires_at", "labels"}) for info in sandboxes],
            "latency": {"claim": activity.claims.series(), "exec": activity.execs.series()},
        })

    @add("GET", "/dashboard/api/stats", answer="application/json", query=(Query("ids"),))
    async def dashboard_stats(tenant: str, ids: str) -> Response:
        """CPU, memory, processes and disk of the listed sandboxes (comma-separated) that the caller may see."""
        wanted = [sandbox_id for sandbox_id in ids.split(",") if sandbox_id]
        if len(wanted) > MAX_STATS:
            raise InvalidRequest(f"asked for the stats of {len(wanted)} sandboxes: ask for {MAX_STATS} at most")
        owners = {info.id: info.tenant for info in await visible(tenant)}
        shown = [sandbox_id for sandbox_id in dict.fromkeys(wanted) if sandbox_id in owners]
        found = await asyncio.gather(*(_stats(node, owners[sandbox_id], sandbox_id) for sandbox_id in shown))
        return _private({sandbox_id: stats for sandbox_id, stats in zip(shown, found, strict=True)
                              if stats is not None})

    @add("GET", "/dashboard/api/sandboxes/{sandbox_id}/commands", answer="application/json", admin=True)
    async def dashboard_commands(tenant: str, sandbox_id: str) -> Response:
        """The sandbox's last commands, newest last: what ran, for whom, its exit code and time. Admins only."""
        return _private(activity.commands.tail(sandbox_id))


async def _stats(node: Node, tenant: str, sandbox_id: str) -> dict[str, Any] | None:
    """None for a sandbox that went, or whose node cannot say, meanwhile: a row without figures, not a failed page."""
    try:
        return (await node.stats(tenant, sandbox_id)).model_dump()
    except RollboxError:
        return None


def _private(value: Any) -> Response:
    """A JSON answer no cache keeps: it shows one tenant's sandboxes."""
    response = json_response(value)
    response.raw_headers.append((b"cache-control", b"no-store"))
    return response
