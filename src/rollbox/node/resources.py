"""The node's templates and warm pools: applying them, and starting containers from them, warm or cold."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from anyio import to_thread

from rollbox.archives import reads_files
from rollbox.engine import Engine
from rollbox.engine.images.registry import Credentials
from rollbox.engine.templates import IMAGE_PREFIX
from rollbox.errors import (
    CapacityExceeded,
    Conflict,
    InvalidRequest,
    InvalidResource,
    NotFound,
    SandboxNotFound,
    SandboxNotRunning,
    TemplateNotFound,
)
from rollbox.models import ApplyStatus, ClaimLimits, ClaimRequest, TemplateInfo, WarmPoolInfo
from rollbox.node.capacity import Capacity
from rollbox.node.deletions import Deletions
from rollbox.node.pools import WarmPool
from rollbox.node.store import NodeStore
from rollbox.node.watch import ExitWatch
from rollbox.spec import Limits, Resource, SandboxTemplate, SandboxWarmPool, TemplateRef

log = logging.getLogger("rollbox.node")


def of_image(pool: SandboxWarmPool, template: str) -> SandboxWarmPool:
    """A warm pool of an image, as the node keeps it: of the template made for that image's digest."""
    spec = pool.spec.model_copy(update={"sandbox_template_ref": TemplateRef(name=template)})
    return pool.model_copy(update={"spec": spec})


def default_claim_caps() -> Limits:
    """What one claim may ask for at most by default: the machine's cores, half its memory."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Limits(cpu=os.cpu_count() or 1, memory=memory // 2, pids=32768, disk=64 * 2**30)


class Resources:
    """Templates (built by the engine) and warm pools (`pools`, by name). Thread-safe."""

    def __init__(self, engine: Engine, store: NodeStore, capacity: Capacity, deletions: Deletions,
                 cold_starts: int, claim_caps: Limits | None = None) -> None:
        self.engine = engine
        self.claim_caps = claim_caps or default_claim_caps()
        self.store = store
        self.capacity = capacity
        self.deletions = deletions
        self.pools: dict[str, WarmPool] = {}
        self.exits = ExitWatch(self._stopped)
        self._lock = threading.Lock()
        # Starting containers costs CPU (runtime, mounts): more at once than the machine runs only slows every
        # one down. The pools share these workers; deletions have their own, so freed room comes back while starts
        # queue.
        self._starter = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rollbox-refill")
        self._cold_starts = threading.BoundedSemaphore(cold_starts)

    # -- applying ---------------------------------------------------------------------------

    async def apply(self, resource: Resource, progress: Callable[[str], None], credentials: Credentials
                    ) -> ApplyStatus:
        """Builds a template or keeps a warm pool; a registry image either names is pulled with `credentials`."""
        loop = asyncio.get_running_loop()

        def say(message: str) -> None:
            loop.call_soon_threadsafe(progress, message)

        if isinstance(resource, SandboxTemplate):
            return await to_thread.run_sync(self._apply_template, resource, say, credentials)
        if resource.spec.image is not None:
            pulled = await to_thread.run_sync(self.engine.images.pull, resource.spec.image, credentials, say)
            resource = of_image(resource, self.engine.image_template(pulled))
        return await to_thread.run_sync(self._apply_pool, resource)

    def _apply_template(self, template: SandboxTemplate, say: Callable[[str], None], credentials: Credentials
                        ) -> ApplyStatus:
        name = template.metadata.name
        if name.startswith(IMAGE_PREFIX):
            raise InvalidResource(f"SandboxTemplate {name}: names starting with {IMAGE_PREFIX!r} are the templates "
                                  "rollbox makes for claims of images: choose another name")
        spec = template.model_dump_json(by_alias=True)
        before = self.engine.store.template(name)
        if before is not None and before[0] == spec and not reads_files(template):
            return "unchanged"
        image = self.engine.build(template, say, credentials)
        if before is None:
            return "created"
        if before == (spec, image):
            return "unchanged"
        for pool in list(self.pools.values()):
            if pool.template == name:
                self.deletions.discard(pool.drain())
        return "configured"

    def _apply_pool(self, resource: SandboxWarmPool) -> ApplyStatus:
        name, template = resource.metadata.name, resource.spec.sandbox_template_ref.name
        if template not in self.engine.templates():
            raise TemplateNotFound(f"warm pool {name}: template {template!r} is not built: apply it first")
        text = resource.model_dump_json(by_alias=True)
        with self._lock:
            existing = self.pools.get(name)
            if existing is not None and existing.resource.model_dump_json(by_alias=True) == text:
                return "unchanged"
            others = {pool.name: pool.resource.spec.replicas for pool in self.pools.values() if pool.name != name}
            self.capacity.fit_pool(name, resource.spec.replicas, others)
            self.store.put_pool(name, text)
            if existing is None:
                self.add_pool(resource, [])
                return "created"
        self.deletions.discard(existing.update(resource))
        return "configured"

    def add_pool(self, resource: SandboxWarmPool, ready: list[str]) -> None:
        """Starts keeping a pool, with the containers already `ready` for it."""
        self.pools[resource.metadata.name] = WarmPool(
            resource, self._launch, lambda container_id: self.deletions.discard([container_id]), self.watch,
            self._starter.submit, ready)

    # -- reading and deleting ---------------------------------------------------------------

    async def templates(self) -> list[TemplateInfo]:
        """The templates applied (those made for claims of images are not listed: their names are digests)."""
        return [TemplateInfo(name=name, spec=json.loads(spec)["spec"], built_at=built, config=image.config)
                for name, spec, image, built in self.engine.store.templates() if not name.startswith(IMAGE_PREFIX)]

    async def template(self, name: str) -> TemplateInfo:
        found = next((t for t in await self.templates() if t.name == name), None)
        if found is None:
            raise TemplateNotFound(f"template {name!r} does not exist: apply it first")
        return found

    async def delete_template(self, name: str) -> None:
        await self.template(name)
        users = [pool.name for pool in self.pools.values() if pool.template == name]
        if users:
            raise Conflict(f"template {name!r} is used by warm pool {', '.join(users)}: delete the pool first")
        await to_thread.run_sync(self.engine.delete_template, name)

    async def warmpools(self) -> list[WarmPoolInfo]:
        return [_pool_info(pool) for pool in sorted(self.pools.values(), key=lambda p: p.name)]

    async def warmpool(self, name: str) -> WarmPoolInfo:
        return _pool_info(self.pool(name))

    async def delete_warmpool(self, name: str) -> None:
        with self._lock:
            pool = self.pool(name)
            del self.pools[name]
        # Stop refilling first: a pool drained while still open starts new containers into itself.
        await to_thread.run_sync(pool.close)
        self.deletions.discard(pool.drain())
        self.store.delete_pool(name)

    def pool(self, name: str) -> WarmPool:
        pool = self.pools.get(name)
        if pool is None:
            raise NotFound(f"warm pool {name!r} does not exist: apply it first")
        return pool

    # -- starting containers ----------------------------------------------------------------

    def take_warm(self, template: str | None, warmpool: str | None, count_miss: bool = True) -> str | None:
        """A ready container of `template` from its pools (`warmpool` first), or None when they are empty
        (counted as a miss of `warmpool`, unless not `count_miss`: a claim that will try another node)."""
        named = self.pools.get(warmpool) if warmpool is not None else None
        if named is not None and named.template == template:
            container_id = named.take()
            if container_id is not None:
                return container_id
        for pool in list(self.pools.values()):
            if pool is not named and pool.template == template:
                container_id = pool.take()
                if container_id is not None:
                    return container_id
        if named is not None and count_miss:
            named.missed()  # its demand outran it: a pool with maxReplicas grows
        return None

    def template_for(self, request: ClaimRequest) -> str | None:
        """The template a claim starts from (None for a snapshot, whose template the engine knows)."""
        if request.snapshot is not None:
            if request.warmpool is not None:
                raise InvalidRequest("give a snapshot or a warm pool, not both")
            return None
        if request.warmpool is not None:
            pool_template = self.pool(request.warmpool).template
            if request.template not in (None, pool_template):
                raise InvalidRequest(f"warm pool {request.warmpool!r} holds template {pool_template!r}, "
                                     f"not {request.template!r}: give one of them")
            return pool_template
        if request.template is None:
            raise InvalidRequest("give a template, a warm pool or a snapshot to create a sandbox from")
        return request.template

    def claim_limits(self, template: str | None, asked: ClaimLimits | None) -> Limits | None:
        """The limits of a claim that asks for its own: its template's, with what it asks, within the node's caps
        for one sandbox (`claim_caps`); None when it asks for nothing."""
        if asked is None or not asked.model_fields_set:
            return None
        base = self.engine.template(template).spec.limits if template else Limits()
        wanted = asked.model_dump(exclude_none=True)
        for field, value in wanted.items():
            cap = getattr(self.claim_caps, field)
            if value > cap:
                raise InvalidRequest(f"limits.{field} {value} is over what this node gives one sandbox ({cap}): ask "
                                     "for less, or run the node with higher caps (--claim-caps)")
        return base.model_copy(update=wanted)

    def health(self) -> dict[str, Any]:
        """The warm pools as the node's health tells them."""
        return {pool.name: {"template": pool.template, "replicas": pool.resource.spec.replicas,
                            "ready": len(pool.ready), "starting": pool.starting,
                            "refill_concurrency": pool.resource.spec.refill_concurrency,
                            "labels": pool.resource.metadata.labels}
                for pool in self.pools.values()}

    def start_cold(self, template: str | None, snapshot: str | None,
                   volume_mounts: list[tuple[str, str, bool]] | None = None, limits: Limits | None = None,
                   seed: int | None = None) -> str:
        """Starts a container for a claim that found no warm one, at most `cold_starts` at a time (one with volumes
        always starts so: a warm container's mounts were fixed as it started)."""
        if snapshot is None:
            self.engine.template(template)  # type: ignore[arg-type]  # an unknown one fails before taking room
        with self._cold_starts:
            self.make_room()
            try:
                return self.engine.create(template, snapshot=snapshot, volume_mounts=volume_mounts or (),
                                          limits=limits, seed=seed).id
            except BaseException:
                self.capacity.release(1)
                raise

    def make_room(self) -> None:
        """Takes room for a cold start, taking a slot from some pool's ready container when the node is full."""
        try:
            self.capacity.reserve(1, wait=False)
            return
        except CapacityExceeded:
            for pool in list(self.pools.values()):
                victim = pool.take()
                if victim is not None:
                    self.deletions.evict(victim)  # its slot passes to the caller
                    return
        self.capacity.reserve(1)

    def shrink(self) -> None:
        """Deletes the ready containers of pools whose bursts have passed."""
        for pool in list(self.pools.values()):
            self.deletions.discard(pool.shrink())

    def wake(self) -> None:
        """Room was made: pools that waited for it refill."""
        for pool in list(self.pools.values()):
            pool.wake()

    def watch(self, container_id: str) -> None:
        """Has a warm container's exit reported (see ExitWatch): a claim must never take a dead one."""
        try:
            fd = self.engine.exit_fd(container_id)
        except SandboxNotFound:
            return
        except SandboxNotRunning:
            self._stopped(container_id)
            return
        except OSError as error:  # out of descriptors, say: the container still serves, unwatched
            log.warning("cannot watch warm container %s for its exit: %s", container_id, error)
            return
        if fd is not None:
            self.exits.add(container_id, fd)

    def close(self) -> None:
        """Stops the pools' refills and waits for starts in flight."""
        for pool in list(self.pools.values()):
            pool.close()
        self._starter.shutdown(wait=True)
        self.exits.close()

    def _stopped(self, container_id: str) -> None:
        """A watched container stopped. A warm one leaves its pool, which starts another; a claimed one
        stays its claim's, whose next call says it stopped (and `reset` brings it back)."""
        for pool in list(self.pools.values()):
            if pool.forget(container_id):
                log.warning("warm container %s of pool %s stopped while it waited: replacing it", container_id,
                            pool.name)
                self.deletions.discard([container_id])
                return

    def _launch(self, pool: WarmPool) -> str:
        self.capacity.reserve(1)
        try:
            container_id = self.engine.create(pool.template).id
        except BaseException:
            self.capacity.release(1)
            raise
        self.store.add_pool_container(container_id, pool.name)
        return container_id


def _pool_info(pool: WarmPool) -> WarmPoolInfo:
    return WarmPoolInfo(name=pool.name, template=pool.template, replicas=pool.resource.spec.replicas,
                        max_replicas=pool.resource.spec.max_replicas, target=pool.target, ready=len(pool.ready),
                        starting=pool.starting, labels=pool.resource.metadata.labels,
                        refill_concurrency=pool.resource.spec.refill_concurrency)
