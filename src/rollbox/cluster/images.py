"""Images across a cluster: each node keeps the layers it pulled, so a claim of an image goes first to a node that
holds it, pulls are spread over the nodes, and `all_nodes` pre-pulls on every one.

Where an image is, the router learns from the pulls and claims it passes on (`holders`): a hint, kept in this
process only, since the nodes are the source of truth. A router that restarts, or another replica, places a claim
of an image anywhere at first, and the node it picks pulls what it lacks. Registry credentials are a tenant's on
every node: a login goes to each node that answers (one that is away at that moment misses it; log in again).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

from rollbox.cluster.placement import claim_order
from rollbox.cluster.remote import RemoteNode
from rollbox.cluster.view import NodeState
from rollbox.errors import ImageNotFound, NodeUnavailable, NotFound
from rollbox.models import ImageInfo, ImagesRequest, RegistryInfo, RegistryLogin

Each = Callable[[Callable[[RemoteNode], Awaitable[object]], list[NodeState]], Awaitable[list[object]]]


class ClusterImages:
    def __init__(self, remote: Callable[[str], RemoteNode], answering: Callable[[], list[NodeState]],
                 serving: Callable[[], list[NodeState]], on_each: Each) -> None:
        self._remote = remote
        self._answering = answering
        self._serving = serving
        self._on_each = on_each
        self.holders: dict[str, set[str]] = {}
        """Image reference -> names of the nodes that pulled or started it."""

    def order(self, reference: str, nodes: list[NodeState]) -> list[str]:
        """The nodes a claim of `reference` tries, best first: those holding it, then the rest; each group least
        loaded first."""
        held = self.holders.get(reference, set())
        ranked = claim_order(nodes, None, {})
        return [name for name in ranked if name in held] + [name for name in ranked if name not in held]

    def claimed(self, reference: str, node: str) -> None:
        self.holders.setdefault(reference, set()).add(node)

    async def pull(self, tenant: str, request: ImagesRequest, progress: Callable[[str], None]) -> list[ImageInfo]:
        """On every node with `all_nodes` (progress prefixed by node), else on the node that holds it or the one
        that has pulled least."""
        serving = self._serving()
        if not serving:
            raise NodeUnavailable("no node of the cluster serves now: start node agents first")
        targets = serving if request.all_nodes else [self._puller(request.images[0], serving)]

        async def one(node: NodeState) -> list[ImageInfo]:
            tell = (lambda message: progress(f"{node.name}: {message}")) if len(targets) > 1 else progress
            pulled = await self._remote(node.url).pull_images(tenant, request, tell)  # type: ignore[arg-type]
            for image in request.images:
                self.claimed(image, node.name)
            return pulled

        answers = await asyncio.gather(*(one(node) for node in targets))
        return answers[0]

    async def prefetch(self, tenant: str, request: ImagesRequest) -> None:
        """Each image to one node (where it is, else the one with fewest pulls under way), or to every node."""
        serving = self._serving()
        if not serving:
            raise NodeUnavailable("no node of the cluster serves now: start node agents first")
        batches: dict[str, list[str]] = {}
        for image in request.images:
            for node in serving if request.all_nodes else [self._puller(image, serving)]:
                batches.setdefault(node.name, []).append(image)
                self.claimed(image, node.name)
        urls = {node.name: node.url for node in serving}
        await asyncio.gather(*(self._remote(urls[name]).prefetch(tenant, ImagesRequest(images=images))  # type: ignore[arg-type]
                               for name, images in batches.items()))

    def _puller(self, image: str, serving: list[NodeState]) -> NodeState:
        held = self.holders.get(image, set())
        for node in serving:
            if node.name in held:
                return node
        counts = Counter(name for names in self.holders.values() for name in names)
        return min(serving, key=lambda node: (counts[node.name], node.sandboxes / max(node.max_sandboxes, 1),
                                              node.name))

    async def images(self, tenant: str) -> list[ImageInfo]:
        """The tenant's images on every node, one entry per digest (the names each node knows it by, together)."""
        merged: dict[str, ImageInfo] = {}
        for infos in await self._on_each(lambda node: node.images(tenant), self._answering()):
            for info in infos:  # type: ignore[attr-defined]
                known = merged.setdefault(info.digest, info)
                known.names = sorted({*known.names, *info.names})
        return list(merged.values())

    async def remove(self, tenant: str, reference: str) -> None:
        removed = await self._on_each(lambda node: _found(node.remove_image(tenant, reference)), self._answering())
        if not any(removed):
            raise ImageNotFound(f"image {reference!r} is not among yours on any node: `rollbox image ls` lists them")
        self.holders.pop(reference, None)

    async def prune(self) -> int:
        return sum(await self._on_each(lambda node: node.prune_images(), self._answering()))  # type: ignore[arg-type]

    async def login(self, tenant: str, host: str, login: RegistryLogin) -> RegistryInfo:
        answers = await self._on_each(lambda node: node.login(tenant, host, login), self._answering())
        if not answers:
            raise NodeUnavailable("no node of the cluster answers now: log in again shortly")
        return answers[0]  # type: ignore[return-value]

    async def registries(self, tenant: str) -> list[RegistryInfo]:
        known: dict[str, RegistryInfo] = {}
        for infos in await self._on_each(lambda node: node.registries(tenant), self._answering()):
            known.update((info.host, info) for info in infos)  # type: ignore[attr-defined]
        return sorted(known.values(), key=lambda info: info.host)

    async def logout(self, tenant: str, host: str) -> None:
        await self._on_each(lambda node: _found(node.logout(tenant, host)), self._answering())


async def _found(call: Awaitable[None]) -> bool:
    """Whether the node had what `call` removes (its 404 is no failure: another node may have it)."""
    try:
        await call
    except NotFound:
        return False
    return True
