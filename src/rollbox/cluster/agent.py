"""The node agent: one machine's engine and node behind rollbox's own HTTP API, for the routers of a cluster.

It is what `rollbox serve` embeds, run on its own (`rollbox node`, or a Ray actor on each Ray node): only callers
holding the cluster secret may use it, each call acting for the tenant it names. Its sandbox ids start with the
node's name, so any router can tell where a sandbox lives.

A node that left the cluster and comes back (a new incarnation: Ray gives a returning node a new id) finds claims
the routers declared lost when it left, and their tenants were told so: it deletes them before it serves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket as sockets
import threading
from pathlib import Path

import uvloop

from rollbox.engine import Engine
from rollbox.engine.images.registry import RegistrySettings
from rollbox.errors import InvalidRequest
from rollbox.node import LocalNode
from rollbox.node.local import DEFAULT_SHUTDOWN_AFTER
from rollbox.server import create_app
from rollbox.server.auth import ClusterSecret
from rollbox.server.listen import server
from rollbox.spec import Limits

log = logging.getLogger("rollbox.cluster")

NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
"""Like a Kubernetes node's name, so that one serves as is."""
MEMBERSHIP = "cluster.json"
"""In the data directory: the incarnation the node last served under."""


class NodeAgent:
    def __init__(self, data_dir: str | Path, name: str, secret: str, *, max_sandboxes: int = 64,
                 tenant_quota: int | None = None, incarnation: str | None = None, log_level: str = "warning",
                 registries: RegistrySettings | None = None, image_budget: int | None = None,
                 claim_caps: Limits | None = None,
                 default_shutdown_after: float | None = DEFAULT_SHUTDOWN_AFTER) -> None:
        if not NODE_NAME.match(name):
            raise InvalidRequest(f"node name {name!r}: use lowercase letters, digits, '-' or '.' (at most 63)")
        ClusterSecret(secret)  # a weak secret fails before the data directory is touched
        self.name = name
        self.incarnation = incarnation
        self.log_level = log_level
        self.engine = Engine(data_dir, registries=registries, image_budget=image_budget)
        try:
            self.node = LocalNode(self.engine, max_sandboxes=max_sandboxes, tenant_quota=tenant_quota, name=name,
                                  claim_caps=claim_caps, default_shutdown_after=default_shutdown_after)
        except BaseException:
            self.engine.close()
            raise
        self.app = create_app(self.node, cluster_secret=secret)
        self.serving = threading.Event()
        self._server = server(self.app, log_level)

    def run(self, listener: sockets.socket) -> None:
        """Serves on `listener` until stopped (SIGINT/SIGTERM in the main thread, or `stop()`), then closes the node.
        Sandboxes and claims stay, for the next agent on this data directory to adopt."""
        try:
            uvloop.run(self._serve(listener))
        finally:
            self.node.close()
            self.engine.close()

    def stop(self) -> None:
        self._server.should_exit = True

    async def _serve(self, listener: sockets.socket) -> None:
        await self._settle_membership()
        serving = asyncio.create_task(self._server.serve(sockets=[listener]))
        while not self._server.started and not serving.done():
            await asyncio.sleep(0.01)
        self.serving.set()
        await serving

    async def _settle_membership(self) -> None:
        record = self.engine.data_dir / MEMBERSHIP
        try:
            before = json.loads(record.read_text()).get("incarnation")
        except (OSError, ValueError):
            before = None
        if self.incarnation is None or before == self.incarnation:
            return
        if before is not None:
            count = await self.node.forget_claims()
            log.warning("node %s is back in the cluster (was %s, now %s): deleted %d claims declared lost",
                        self.name, before, self.incarnation, count)
        record.write_text(json.dumps({"name": self.name, "incarnation": self.incarnation}))
