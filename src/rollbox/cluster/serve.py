"""`serve_router`: a cluster's router, the same HTTP API as `rollbox serve` over every node of the cluster."""

from __future__ import annotations

import logging
import socket as sockets
from collections.abc import Iterable

import uvloop

from rollbox._signals import exit_on_sigterm
from rollbox.cluster.forwarding import Forwarding
from rollbox.cluster.router import ClusterNode
from rollbox.cluster.watcher import Members
from rollbox.server import create_app
from rollbox.server.auth import Tenants
from rollbox.server.listen import listen_tcp, server
from rollbox.server.serve import refuse_open

log = logging.getLogger("rollbox.cluster")


def serve_router(members: Members, secret: str, *, host: str = "127.0.0.1", port: int = 8080,
                 listener: sockets.socket | None = None, tokens: dict[str, str] | None = None,
                 admins: Iterable[str] = (), node_capacity: int = 64, release_idle: bool = False,
                 log_level: str = "warning") -> None:
    """Serves until SIGINT/SIGTERM. Nothing is lost when it stops: the nodes hold every claim and pool."""
    admins = tuple(admins)
    if listener is None:
        refuse_open(host, tokens)
    Tenants(tokens, admins)
    exit_on_sigterm()
    cluster = ClusterNode(members, secret, node_capacity=node_capacity, release_idle=release_idle)
    app = create_app(cluster, tokens, admins=admins,
                     front=lambda routes, metrics, tenants, fail: Forwarding(routes, cluster, tenants, metrics, fail))
    listener = listener or listen_tcp(host, port)

    async def run() -> None:
        await cluster.start()
        try:
            await server(app, log_level).serve(sockets=[listener])
        finally:
            await cluster.close()

    with listener:
        uvloop.run(run())
