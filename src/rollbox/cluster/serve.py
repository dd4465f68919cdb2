"""`serve_router`: a cluster's router, the same HTTP API as `rollbox serve` over every node of the cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket as sockets
from collections.abc import AsyncIterator, Iterable
from typing import Literal

import uvloop

from rollbox import tracing
from rollbox._signals import exit_on_sigterm
from rollbox.cluster import edge, edge_config
from rollbox.cluster.forwarding import Forwarding
from rollbox.cluster.router import ClusterNode
from rollbox.cluster.watcher import TICK, Members
from rollbox.errors import InvalidRequest
from rollbox.server import create_app
from rollbox.server.app import DEFAULT_MAX_BODY
from rollbox.server.auth import Tenants
from rollbox.server.listen import listen_tcp, server
from rollbox.server.metrics import Metrics
from rollbox.server.ports import DEFAULT_DOMAINS
from rollbox.server.serve import refuse_open

log = logging.getLogger("rollbox.cluster")

DataPlane = Literal["auto", "nginx", "python"]
"""Who forwards an episode's commands and file calls to their nodes: nginx in front of the router (edge.py), the
router itself (forwarding.py), or nginx when it is installed and tracing is off (tracing needs the router's spans)."""


def serve_router(members: Members, secret: str, *, host: str = "127.0.0.1", port: int = 8080,
                 listener: sockets.socket | None = None, tokens: dict[str, str] | None = None,
                 admins: Iterable[str] = (), node_capacity: int = 64, release_idle: bool = False,
                 data_plane: DataPlane = "auto", log_level: str = "warning",
                 sandbox_domains: tuple[str, ...] = DEFAULT_DOMAINS, in_cluster: bool = False) -> None:
    """Serves until SIGINT/SIGTERM. Nothing is lost when it stops: the nodes hold every claim and pool."""
    admins = tuple(admins)
    if listener is None:
        refuse_open(host, tokens)
    Tenants(tokens, admins)
    nginx = _nginx(data_plane, secret)
    exit_on_sigterm()
    cluster = ClusterNode(members, secret, node_capacity=node_capacity, release_idle=release_idle,
                          data_plane="nginx" if nginx else "python")
    metrics = Metrics()  # the edge's calls are counted with the routes' own
    app = create_app(cluster, tokens, admins=admins, metrics=metrics, sandbox_domains=sandbox_domains,
                     in_cluster=in_cluster,
                     front=lambda routes, _, tenants, fail: Forwarding(routes, cluster, tenants, metrics, fail))
    listener = listener or listen_tcp(host, port)

    async def run() -> None:
        await cluster.start()
        try:
            async with _edge(nginx, listener, cluster, secret, tokens, metrics) as serving:
                await server(app, log_level).serve(sockets=[serving])
        finally:
            await cluster.close()

    with listener:
        uvloop.run(run())


def _nginx(data_plane: DataPlane, secret: str) -> str | None:
    """nginx's path when it forwards, else None."""
    if data_plane == "python":
        return None
    found = edge.available()
    why = ("nginx is not installed" if found is None else "tracing is on" if tracing.on
           else "the cluster secret has characters nginx's configuration cannot hold as they are"
           if not edge_config.SAFE.fullmatch(secret) else None)
    if why is None:
        return found
    if data_plane == "nginx":
        raise InvalidRequest(f"--data-plane nginx: {why}; use --data-plane python, or fix that")
    log.info("the router forwards commands and files itself: %s", why)
    return None


@contextlib.asynccontextmanager
async def _edge(nginx: str | None, listener: sockets.socket, cluster: ClusterNode, secret: str,
                tokens: dict[str, str] | None, metrics: Metrics) -> AsyncIterator[sockets.socket]:
    """The socket the router's routes serve on: `listener`, or with nginx a loopback port of their own behind it,
    nginx's nodes kept in line with the router's view meanwhile, and the commands and claims it passes to them
    counted and logged as the router's own."""
    if nginx is None:
        yield listener
        return
    with listen_tcp("127.0.0.1", 0) as routes:
        front = edge.Edge(listener, f"127.0.0.1:{routes.getsockname()[1]}", secret, tokens, DEFAULT_MAX_BODY,
                          nginx)
        try:
            front.start(cluster.watcher.view)
            following = [asyncio.create_task(_follow(front, cluster)),
                         asyncio.create_task(front.follow_calls(metrics, cluster.withdrawals.add))]
            try:
                yield routes
            finally:
                for task in following:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            front.close()


async def _follow(front: edge.Edge, cluster: ClusterNode) -> None:
    """Gives nginx the nodes' addresses as the router's view changes (the watcher replaces it whole)."""
    seen = None
    while True:
        view = cluster.watcher.view
        if view is not seen:
            try:
                front.update(view)
                seen = view
            except Exception:
                log.exception("updating nginx's nodes failed; trying again")
        await asyncio.sleep(TICK)
