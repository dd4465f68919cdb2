"""How a cluster's router places a claim: on a node with a ready warm sandbox of its pool (most ready first, as the last
health report counted them less the claims sent there since), else on the least loaded node; a claim from a
snapshot on a node that holds it, one with volumes where they are, one of an image where it was pulled.

A claim sent again after its answer was lost (`retry`, with its `request_key`) first asks every answering node
for the sandbox that key made: the nodes are the source of truth, so any router finds it, whichever served the
first attempt (docs/faults.md). A node that stops answering while it makes a claim holds up nothing: the claim is
cancelled there and tried on the next node.

Every claim and key lookup sent to a node carries an attempt id. One whose answer the router drops (cancelled, cut
off, a second sandbox found for a key, or its own caller gone: `answered`) is withdrawn on its node
(withdrawals.py), so a sandbox nobody holds ends there (node/answers.py).
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable

import httpx
from cachetools import TTLCache

from rollbox.cluster.images import ClusterImages
from rollbox.cluster.placement import ReadyEstimate
from rollbox.cluster.remote import RemoteNode
from rollbox.cluster.view import NodeState
from rollbox.cluster.volumes import ClusterVolumes
from rollbox.cluster.watcher import Watcher
from rollbox.cluster.withdrawals import Withdrawals
from rollbox.errors import CapacityExceeded, NodeUnavailable, SnapshotNotFound
from rollbox.models import ClaimRequest, SandboxInfo

SENT_WINDOW = 60.0
"""Seconds the router remembers where an answered sandbox came from, for a caller that turns out gone."""


def new_attempt() -> str:
    return secrets.token_hex(16)


class ClusterClaims:
    def __init__(self, watcher: Watcher, remote: Callable[[str], RemoteNode], answering: Callable[[], list[NodeState]],
                 images: ClusterImages, volumes: ClusterVolumes) -> None:
        self._watcher = watcher
        self._remote = remote
        self._answering = answering
        self._images = images
        self._volumes = volumes
        self._ready = ReadyEstimate()
        self.withdrawals = Withdrawals(remote)
        self._sent: TTLCache[str, tuple[str, str]] = TTLCache(math.inf, SENT_WINDOW)
        """Each sandbox the router answered and the node's URL and attempt it came by, until `answered` (kept
        SENT_WINDOW for callers that never tell)."""

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
            attempt = new_attempt()
            try:
                info = await self._watcher.answering(name, self._remote(node.url).claim(tenant, request, attempt))
            except (CapacityExceeded, NodeUnavailable, httpx.TransportError) as error:
                refused = error  # full, or gone since the last look: the next node may have room
                if not isinstance(error, CapacityExceeded | httpx.ConnectError | httpx.ConnectTimeout):
                    self.withdrawals.add(node.url, attempt)  # it may have been made: for nobody
                continue
            if request.image:
                self._images.claimed(request.image, name)
            return self._sending(info, node.url, attempt)
        if isinstance(refused, CapacityExceeded):
            raise CapacityExceeded(f"no node of the cluster has room for this claim; the last one tried: {refused}")
        raise NodeUnavailable("no node of the cluster serves claims now: see the router's /healthz")

    async def made(self, tenant: str, key: str) -> SandboxInfo | None:
        """The sandbox a claim with `key` made, on whichever node answers for it (waiting for one under way). Two
        nodes may each have made one (a claim nginx gave up on, and the router's): the second is withdrawn."""
        nodes = self._answering()
        attempts = [new_attempt() for _ in nodes]
        found = await asyncio.gather(*(self._watcher.answering(node.name, self._remote(node.url).claims(
            tenant, key, attempt)) for node, attempt in zip(nodes, attempts, strict=True)), return_exceptions=True)
        chosen: tuple[SandboxInfo, str, str] | None = None
        failure: BaseException | None = None
        for node, attempt, answer in zip(nodes, attempts, found, strict=True):
            if answer == []:
                continue
            if isinstance(answer, list) and chosen is None:
                chosen = (answer[0], node.url, attempt)
                continue
            self.withdrawals.add(node.url, attempt)  # a second sandbox, or an answer that may have handed one out
            if isinstance(answer, BaseException) and not isinstance(answer, NodeUnavailable | httpx.TransportError):
                failure = answer
        if failure is not None:
            if chosen is not None:
                self.withdrawals.add(chosen[1], chosen[2])
            raise failure
        return None if chosen is None else self._sending(*chosen)

    def answered(self, sandbox_id: str, taken: bool) -> None:
        """The router's answer carrying the sandbox reached its caller (`taken`) or found it gone: then the node's
        answer is withdrawn."""
        sent = self._sent.pop(sandbox_id, None)
        if sent is not None and not taken:
            self.withdrawals.add(sent[0], sent[1])

    def _sending(self, info: SandboxInfo, url: str, attempt: str) -> SandboxInfo:
        self._sent[info.id] = (url, attempt)
        return info

    async def holding_snapshot(self, tenant: str, name: str, nodes: list[NodeState]) -> list[NodeState]:
        held = await asyncio.gather(*(self._remote(node.url).snapshots(tenant) for node in nodes),
                                    return_exceptions=True)
        holding = [node for node, snapshots in zip(nodes, held, strict=True)
                   if isinstance(snapshots, list) and any(snapshot.name == name for snapshot in snapshots)]
        if not holding:
            raise SnapshotNotFound(f"snapshot {name!r} does not exist")
        return holding
