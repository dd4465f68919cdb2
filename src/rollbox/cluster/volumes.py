"""Volumes across a cluster: each lives on the node that made it (its image is a file there), so the router finds
a volume by asking the nodes, and places a claim that names volumes on the node that holds them.

Nothing is kept here: the nodes are the source of truth, as for snapshots. A claim whose volumes exist on no node
and all carry a `size` goes wherever claims go, and its node makes them. Two volumes of one claim on two nodes
cannot be mounted together: 400. A template's declared volumes do not steer placement (the router would have to
read the template on every claim): claims of such a template reach a node that has them only if `size` lets any
node make them, or there is one node.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

import httpx

from rollbox.cluster.remote import RemoteNode
from rollbox.cluster.view import NodeState
from rollbox.errors import InvalidRequest, NodeUnavailable, VolumeInUse, VolumeNotFound
from rollbox.models import VolumeInfo, VolumeRequest
from rollbox.spec import VolumeMount

log = logging.getLogger("rollbox.cluster")


class ClusterVolumes:
    def __init__(self, remote: Callable[[str], RemoteNode], answering: Callable[[], list[NodeState]]) -> None:
        self._remote = remote
        self._answering = answering

    async def _held(self, tenant: str, nodes: list[NodeState]) -> dict[str, tuple[NodeState, VolumeInfo]]:
        """The tenant's volumes on `nodes`, by name, with the node holding each (a node not answering is left out)."""
        answers = await asyncio.gather(*(self._remote(node.url).volumes(tenant) for node in nodes if node.url),
                                       return_exceptions=True)
        held: dict[str, tuple[NodeState, VolumeInfo]] = {}
        for node, answer in zip([node for node in nodes if node.url], answers, strict=True):
            if isinstance(answer, httpx.TransportError):
                log.warning("node %s did not answer for its volumes: %s", node.name, answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                held.update((volume.name, (node, volume)) for volume in answer)
        return held

    async def create(self, tenant: str, request: VolumeRequest, serving: list[NodeState]) -> VolumeInfo:
        """Makes the volume on the least loaded node (of those, the one holding fewest of the tenant's volumes), unless
        some node holds one of that name already."""
        held = await self._held(tenant, self._answering())
        if request.name in held:
            raise VolumeInUse(f"volume {request.name!r} exists already (on node {held[request.name][0].name})")
        if not serving:
            raise NodeUnavailable("no node of the cluster serves now: start node agents first")
        counts = Counter(node.name for node, _ in held.values())
        node = min(serving, key=lambda node: (node.sandboxes / max(node.max_sandboxes, 1), counts[node.name],
                                              node.name))
        return await self._remote(node.url).create_volume(tenant, request)  # type: ignore[arg-type]

    async def list(self, tenant: str) -> list[VolumeInfo]:
        held = await self._held(tenant, self._answering())
        return [held[name][1] for name in sorted(held)]

    async def get(self, tenant: str, name: str) -> VolumeInfo:
        return (await self._home(tenant, name))[1]

    async def delete(self, tenant: str, name: str) -> None:
        node, _ = await self._home(tenant, name)
        await self._remote(node.url).delete_volume(tenant, name)  # type: ignore[arg-type]

    async def _home(self, tenant: str, name: str) -> tuple[NodeState, VolumeInfo]:
        held = await self._held(tenant, self._answering())
        if name not in held:
            raise VolumeNotFound(f"volume {name!r} does not exist: create it first")
        return held[name]

    async def for_claim(self, tenant: str, mounts: list[VolumeMount], nodes: list[NodeState]) -> list[NodeState]:
        """The nodes a claim naming `mounts` may go to: the one holding its volumes, or any when none exists yet
        and every one has a size to be made with."""
        held = await self._held(tenant, nodes)
        homes = {held[mount.name][0].name for mount in mounts if mount.name in held}
        if len(homes) > 1:
            where = ", ".join(f"{mount.name} on {held[mount.name][0].name}" for mount in mounts if mount.name in held)
            raise InvalidRequest(f"a sandbox mounts volumes of one node, and these live on several ({where})")
        if homes:
            return [node for node in nodes if node.name in homes]
        missing = [mount.name for mount in mounts if mount.size is None]
        if missing:
            raise VolumeNotFound(f"volume {missing[0]!r} does not exist: create it first, or give its size")
        return nodes
