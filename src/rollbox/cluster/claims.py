"""How a cluster's router places a claim: on a node with a ready warm sandbox of its pool (most ready first, as the last
health report counted them less the claims sent there since), else on the least loaded node; a claim from a
snapshot on a node that holds it, one with volumes where they are, one of an image where it was pulled.

A claim sent again after its answer was lost (`retry`, with its `request_key`) first asks every answering node
for the sandbox that key made: the nodes are the source of truth, so any router finds it, whichever served the
first attempt (docs/faults.md). A node that stops answering while it makes a claim holds up nothing: the claim is
cancelled there (the node drops what it makes for nobody) and tried on the next node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from rollbox.cluster.images import ClusterImages
from rollbox.cluster.placement import ReadyEstimate
from rollbox.cluster.remote import RemoteNode
from rollbox.cluster.view import NodeState
from rollbox.cluster.volumes import ClusterVolumes
from rollbox.cluster.watcher import Watcher
from rollbox.errors import CapacityExceeded, NodeUnavailable, SnapshotNotFound
from rollbox.models import ClaimRequest, SandboxInfo


class ClusterClaims:
    def __init__(self, watcher: Watcher, remote: Callable[[str], RemoteNode], answering: Callable[[], list[NodeState]],
                 images: ClusterImages, volumes: ClusterVolumes) -> None:
        self._watcher = watcher
        self._remote = remote
        self._answering = answering
        self._images = images
        self._volumes = volumes
        self._ready = ReadyEstimate()

    async def claim(self, tenant: str, request: ClaimRequest, retry: bool) -> SandboxInfo:
        if retry and request.request_key:
            made = await self.made(tenant, request.request_key)
            if made is not None:
                return made
        nodes = self._watcher.serving()
        if request.snapshot:
            nodes = await self.holding_snapshot(tenant, request.snapshot, nodes)
        if request.volumes:
            nodes = await self._volumes.for_claim(tenant, request.volumes, nodes)
        self._ready.refresh(self._watcher.view)
        refused: Exception | None = None
        candidates = self._images.order(request.image, nodes) if request.image and not request.warmpool else \
            self._ready.candidates(nodes, request.warmpool)
        for name in candidates:
            node = self._watcher.view[name]
            self._ready.took(name, request.warmpool)
            try:
                info = await self._watcher.answering(name, self._remote(node.url).claim(tenant, request))
                if request.image:
                    self._images.claimed(request.image, name)
                return info
            except (CapacityExceeded, NodeUnavailable, httpx.TransportError) as error:
                refused = error  # full, or gone since the last look: the next node may have room
        if isinstance(refused, CapacityExceeded):
            raise refused
        raise NodeUnavailable("no node of the cluster serves claims now: see the router's /healthz")

    async def made(self, tenant: str, key: str) -> SandboxInfo | None:
        """The sandbox a claim with `key` made, on whichever node answers for it (waiting for one under way)."""
        found = await asyncio.gather(*(self._watcher.answering(node.name, self._remote(node.url).claims(tenant, key))
                                       for node in self._answering()), return_exceptions=True)
        for answer in found:
            if isinstance(answer, list) and answer:
                return answer[0]
            if isinstance(answer, BaseException) and not isinstance(answer, NodeUnavailable | httpx.TransportError):
                raise answer
        return None

    async def holding_snapshot(self, tenant: str, name: str, nodes: list[NodeState]) -> list[NodeState]:
        held = await asyncio.gather(*(self._remote(node.url).snapshots(tenant) for node in nodes),
                                    return_exceptions=True)
        holding = [node for node, snapshots in zip(nodes, held, strict=True)
                   if isinstance(snapshots, list) and any(snapshot.name == name for snapshot in snapshots)]
        if not holding:
            raise SnapshotNotFound(f"snapshot {name!r} does not exist")
        return holding
