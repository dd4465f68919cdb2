"""A node's registry images as its tenants see them: pulls with the tenant's own credentials, the images each
tenant has used, and the template a claim of an image starts from.

Credentials belong to a tenant (`PUT /v1/registries/{host}`): they are stored in the node's data
directory (root only), handed to skopeo in a private file for each pull, and never logged, shown back
or put in a sandbox. Whether a tenant may start an image is the registry's answer to that tenant's
credentials (the engine's image store asks it), never whether another tenant pulled it first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from anyio import to_thread

from rollbox.engine import Engine
from rollbox.engine.images.catalog import ImageRecord
from rollbox.engine.images.reference import parse
from rollbox.engine.images.registry import Credentials
from rollbox.errors import ImageNotFound, InvalidRequest, NotFound, RollboxError
from rollbox.models import ClaimRequest, ImageInfo, ImagesRequest, RegistryInfo, RegistryLogin
from rollbox.node.pools import WarmPool
from rollbox.node.store import NodeStore

Say = Callable[[str], None]
log = logging.getLogger("rollbox.node")
PREFETCH_WORKERS = 2


class NodeImages:
    def __init__(self, engine: Engine, store: NodeStore) -> None:
        self.engine = engine
        self.store = store
        self._known: set[tuple[str, str]] = set()
        """(tenant, digest) pairs already recorded in this process: a claim writes its tenant once, not each time."""
        self._prefetching = ThreadPoolExecutor(max_workers=PREFETCH_WORKERS, thread_name_prefix="rollbox-prefetch")

    # -- credentials -------------------------------------------------------------------------

    def credentials(self, tenant: str) -> Credentials:
        return {host: (username, password) for host, username, password in self.store.registry_credentials(tenant)}

    async def login(self, tenant: str, host: str, login: RegistryLogin) -> RegistryInfo:
        host = _host(host)
        await to_thread.run_sync(self.store.put_registry_credentials, tenant, host, login.username, login.password)
        return RegistryInfo(host=host, username=login.username)

    async def registries(self, tenant: str) -> list[RegistryInfo]:
        return [RegistryInfo(host=host, username=username)
                for host, username, _ in self.store.registry_credentials(tenant)]

    async def logout(self, tenant: str, host: str) -> None:
        if not await to_thread.run_sync(self.store.delete_registry_credentials, tenant, _host(host)):
            raise NotFound(f"no credentials for registry {host!r}: `rollbox registry ls` lists yours")

    # -- images ------------------------------------------------------------------------------

    async def pull(self, tenant: str, request: ImagesRequest, progress: Say | None = None) -> list[ImageInfo]:
        say = _threadsafe(progress)
        pulled = []
        for reference in request.images:
            image = await to_thread.run_sync(self.engine.images.pull, reference, self.credentials(tenant), say)
            await to_thread.run_sync(self.store.add_image_tenant, image.digest, tenant)
            self._known.add((tenant, image.digest))
            pulled.append(self._info(self.engine.images.get(image.digest), {}))
        return pulled

    async def template_for(self, tenant: str, request: ClaimRequest, pool: Callable[[str], WarmPool]) -> str:
        """The template a claim of an image starts from; `pool` finds a warm pool it names, which must hold it."""
        assert request.image is not None
        if request.template is not None or request.snapshot is not None:
            raise InvalidRequest("give an image, a template or a snapshot to start from, not two of them")
        template = await self.template(tenant, request.image)
        if request.warmpool is not None and pool(request.warmpool).template != template:
            raise InvalidRequest(f"warm pool {request.warmpool!r} does not hold image {request.image!r}")
        return template

    async def template(self, tenant: str, reference: str, runtime: str = "runc") -> str:
        """The template a claim of `reference` starts from: the image pulled (once) with the tenant's credentials."""
        pulled = await to_thread.run_sync(self.engine.images.pull, reference, self.credentials(tenant))
        if (tenant, pulled.digest) not in self._known:
            await to_thread.run_sync(self.store.add_image_tenant, pulled.digest, tenant)
            self._known.add((tenant, pulled.digest))
        return self.engine.image_template(pulled, runtime)

    async def prefetch(self, tenant: str, request: ImagesRequest) -> None:
        """Pulls the images in the background (PREFETCH_WORKERS at a time) so that their claims start at once; a
        failure is logged in one line and the claim that needs the image meets it again."""
        credentials = self.credentials(tenant)

        def fetch(reference: str) -> None:
            try:
                pulled = self.engine.images.pull(reference, credentials)
                self.store.add_image_tenant(pulled.digest, tenant)
            except RollboxError as error:
                log.warning("prefetching %s failed: %s", reference, error)

        for reference in request.images:
            self._prefetching.submit(fetch, reference)

    def close(self) -> None:
        self._prefetching.shutdown(wait=False, cancel_futures=True)

    async def images(self, tenant: str, every: bool = False) -> list[ImageInfo]:
        """The images `tenant` pulled or claimed (all of the node's with `every`), shared bytes marked."""
        mine = None if every else self.store.image_digests(tenant)
        records = [record for record in self.engine.images.images() if mine is None or record.digest in mine]
        owners: dict[str, int] = {}
        for record in records:
            for layer in record.layers:
                owners[layer] = owners.get(layer, 0) + 1
        return [self._info(record, owners) for record in records]

    async def remove(self, tenant: str, reference: str, every: bool = False) -> None:
        """Drops the image from the tenant's list; its files go once no tenant, template or sandbox holds it."""
        record = self._find(tenant, reference, every)
        users = await to_thread.run_sync(self.store.remove_image_tenant, record.digest, None if every else tenant)
        self._known = {known for known in self._known if known[1] != record.digest}
        if not users:
            await to_thread.run_sync(self.engine.images.remove, record.digest)

    async def prune(self) -> int:
        """Removes every image layer nothing holds; returns the bytes freed."""
        return await to_thread.run_sync(lambda: self.engine.images.evict(keep=set(), budget=0))

    def _find(self, tenant: str, reference: str, every: bool) -> ImageRecord:
        mine = None if every else self.store.image_digests(tenant)
        try:
            record = self.engine.images.get(reference)
        except ImageNotFound:
            record = None
        if record is None or (mine is not None and record.digest not in mine):
            raise ImageNotFound(f"image {reference!r} is not among yours on this node: `rollbox image ls` lists them")
        return record

    @staticmethod
    def _info(record: ImageRecord, owners: dict[str, int]) -> ImageInfo:
        settings = record.settings
        return ImageInfo(digest=record.digest, names=record.names, layers=len(record.layers),
                         size=sum(record.sizes.values()), layer_bytes=dict(record.sizes),
                         shared=sum(size for layer, size in record.sizes.items() if owners.get(layer, 0) > 1),
                         pulled_at=record.pulled_at, used_at=record.used_at, user=settings.get("User") or None,
                         workdir=settings.get("WorkingDir") or None, cmd=settings.get("Cmd"),
                         entrypoint=settings.get("Entrypoint"))


def _host(host: str) -> str:
    """A registry's host as references name it (`HOST[:PORT]`)."""
    try:
        return parse(f"{host}/x").host
    except InvalidRequest:
        raise InvalidRequest(f"{host!r} is not a registry host such as ghcr.io or 127.0.0.1:5000") from None


def _threadsafe(progress: Say | None) -> Say | None:
    """`progress` called on the caller's event loop from the pulling thread."""
    if progress is None:
        return None
    loop = asyncio.get_running_loop()
    return lambda message: loop.call_soon_threadsafe(progress, message)


class ImageService(Protocol):
    """What serves the `Node` interface's image calls: this node's `NodeImages`, or a cluster's."""

    async def pull(self, tenant: str, request: ImagesRequest, progress: Say) -> list[ImageInfo]: ...
    async def prefetch(self, tenant: str, request: ImagesRequest) -> None: ...
    async def images(self, tenant: str) -> list[ImageInfo]: ...
    async def remove(self, tenant: str, reference: str) -> None: ...
    async def prune(self) -> int: ...
    async def login(self, tenant: str, host: str, login: RegistryLogin) -> RegistryInfo: ...
    async def registries(self, tenant: str) -> list[RegistryInfo]: ...
    async def logout(self, tenant: str, host: str) -> None: ...


class ImageOperations:
    """The `Node` interface's image calls, each passed to `image_service` (a mixin of the nodes)."""

    image_service: ImageService

    async def pull_images(self, tenant: str, request: ImagesRequest, progress: Say) -> list[ImageInfo]:
        return await self.image_service.pull(tenant, request, progress)

    async def prefetch(self, tenant: str, request: ImagesRequest) -> None:
        await self.image_service.prefetch(tenant, request)

    async def images(self, tenant: str) -> list[ImageInfo]:
        return await self.image_service.images(tenant)

    async def remove_image(self, tenant: str, reference: str) -> None:
        await self.image_service.remove(tenant, reference)

    async def prune_images(self) -> int:
        return await self.image_service.prune()

    async def login(self, tenant: str, host: str, login: RegistryLogin) -> RegistryInfo:
        return await self.image_service.login(tenant, host, login)

    async def registries(self, tenant: str) -> list[RegistryInfo]:
        return await self.image_service.registries(tenant)

    async def logout(self, tenant: str, host: str) -> None:
        await self.image_service.logout(tenant, host)
