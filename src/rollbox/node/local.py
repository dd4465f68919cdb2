"""`LocalNode`: this machine's templates, warm pools and claims, over an in-process engine.

A tenant's sandbox is a claim on one of the engine's containers; `reset` points the claim at a fresh container and
deletes the old one in the background, so the sandbox id never changes. Blocking engine calls run in worker threads;
the hot paths stay on the event loop: `exec` (the engine's agent client is async) and a warm claim (popping a pool
and one SQLite write). The node composes its parts: `Capacity` (room and quotas), `Resources` (templates, warm
pools, starts), `Deletions` (containers going in the background), `HeldClaims` (the claims, each call's use of one,
and dropping one), `ClaimWriter` (claims' commits), a `Sweeper` thread (expiry, idle pause, reconciling with the
engine) and `recover` (what a restart finds); processes, snapshots, images, ports, networks and
files are mixins of their own.
"""
from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from anyio import to_thread

from rollbox.engine import Engine
from rollbox.errors import (
    CapacityExceeded,
    InvalidRequest,
    NotFound,
    SandboxNotFound,
)
from rollbox.models import (
    MAX_FORK,
    ApplyStatus,
    ExecRequest,
    ExecResult,
    ModelCallLog,
    SandboxInfo,
    SandboxStats,
    TemplateInfo,
    VolumeInfo,
    VolumeRequest,
    WarmPoolInfo,
)
from rollbox.node import determinism
from rollbox.node.answers import Answers
from rollbox.node.base import OutputCallback
from rollbox.node.capacity import Capacity
from rollbox.node.claiming import ClaimOperations
from rollbox.node.claims import Claim, as_sandbox, environment
from rollbox.node.cost import CostMeters
from rollbox.node.deletions import Deletions
from rollbox.node.files import FileOperations
from rollbox.node.gateway import Gateway
from rollbox.node.held import HeldClaims
from rollbox.node.images import ImageOperations, NodeImages
from rollbox.node.keys import KEY_WINDOW, ClaimKeys
from rollbox.node.leases import LeaseOperations, Leases
from rollbox.node.network import NetworkOperations
from rollbox.node.ports import PortOperations
from rollbox.node.processes import ProcessOperations
from rollbox.node.recovery import recover
from rollbox.node.resources import Resources
from rollbox.node.snapshots import SnapshotOperations
from rollbox.node.store import NodeStore, snapshot_key
from rollbox.node.sweeper import Sweeper
from rollbox.node.volumes import NodeVolumes, read_only
from rollbox.node.writer import ClaimWriter
from rollbox.spec import Limits, Resource

DEFAULT_SHUTDOWN_AFTER = 3600.0
"""Seconds a claim with neither a lease nor a `shutdown_after` of its own lasts (`--default-shutdown-after`): a
trainer that crashed leaks its sandboxes for that long at most (docs/faults.md)."""


class LocalNode(ClaimOperations, ProcessOperations, SnapshotOperations, ImageOperations, PortOperations,
                NetworkOperations, FileOperations, LeaseOperations):
    """The `Node` of this machine. Thread-safe; one per engine.

    `max_sandboxes` caps every container on the node (claimed, warm, starting, being deleted);
    `tenant_quota` caps the sandboxes one tenant holds at once; `cold_starts` caps the claims starting a
    container at the same time (the others wait their turn). A node of a cluster has a `name`, which starts
    every sandbox id it gives out (`<name>-<hex>`), so that any router can tell which node serves a sandbox.
    A claim with neither a lease nor a `shutdown_after` of its own ends after `default_shutdown_after` seconds
    (None: never).
    """

    def __init__(self, engine: Engine, *, max_sandboxes: int = 64, tenant_quota: int | None = None,
                 cold_starts: int = 8, tick: float = 0.2, name: str | None = None, claim_caps: Limits | None = None,
                 default_shutdown_after: float | None = DEFAULT_SHUTDOWN_AFTER) -> None:
        self.engine = engine
        self.name = name
        self.default_shutdown_after = default_shutdown_after
        self._id_prefix = f"{name}-" if name else ""
        self.store = NodeStore(engine.data_dir / "node.db")
        self.closed = threading.Event()
        self.capacity = Capacity(max_sandboxes, tenant_quota, lambda: self.resources.wake())
        self.deletions = Deletions(engine, self.store, self.capacity, self.closed)
        self.resources = Resources(engine, self.store, self.capacity, self.deletions, cold_starts, claim_caps)
        self._writer = ClaimWriter(self.store)
        self.costs = CostMeters(engine, lambda sandbox_id: self.held.busy(sandbox_id), self._warm, self.closed)
        self.node_volumes = NodeVolumes(engine)
        self.gateway = Gateway(engine)
        self.node_images = self.image_service = NodeImages(engine, self.store)
        self.held = HeldClaims(engine, self.store, self.capacity, self.costs, self.node_volumes, self.deletions,
                               self.gateway.close)
        self.answers = Answers(KEY_WINDOW)
        self.keys = ClaimKeys(self.held.claims.get, self.answers)
        self.leases = Leases()
        recovered = recover(engine, self.store, self.capacity, self.resources, self.deletions)
        self.held.add(recovered)
        self.keys.adopt(recovered)
        self.leases.adopt(recovered)
        self.node_volumes.adopt(recovered)
        for claim in recovered:  # accounted from now: what they used before is unknown
            self.costs.open(claim.sandbox_id, claim.container_id)
        self._sweeper = Sweeper(engine, self.store, self.capacity, self.resources, self.held, self.leases, self.closed,
                                tick)

    # -- resources --------------------------------------------------------------------------

    async def apply(self, resource: Resource, progress: Callable[[str], None], tenant: str | None = None
                    ) -> ApplyStatus:
        self.node_volumes.forget_templates()
        self.gateway.forget_templates()
        return await self.resources.apply(resource, progress, self.node_images.credentials(tenant) if tenant else {})

    async def templates(self) -> list[TemplateInfo]:
        return await self.resources.templates()

    async def template(self, name: str) -> TemplateInfo:
        return await self.resources.template(name)

    async def delete_template(self, name: str) -> None:
        await self.resources.delete_template(name)
        self.node_volumes.forget_templates()
        self.gateway.forget_templates()

    async def warmpools(self) -> list[WarmPoolInfo]:
        return await self.resources.warmpools()

    async def warmpool(self, name: str) -> WarmPoolInfo:
        return await self.resources.warmpool(name)

    async def delete_warmpool(self, name: str) -> None:
        await self.resources.delete_warmpool(name)

    # -- claims -----------------------------------------------------------------------------

    async def claims(self, tenant: str, request_key: str | None = None) -> list[SandboxInfo]:
        """The tenant's sandboxes; with `request_key`, the one its claim made (waited for while under way), if
        any: whoever asks holds it now."""
        if request_key is not None:
            found = await self.keys.find(tenant, request_key)
            return [] if found is None else [found]
        owned = [claim for claim in list(self.held.claims.values()) if claim.tenant == tenant]
        owned.sort(key=lambda c: c.created_at)
        # Each claim's state reads its runtime's state file: a long list is read off the event loop.
        return await to_thread.run_sync(lambda: [self._shown(claim) for claim in owned])

    async def get(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return self._shown(self.held.get(tenant, sandbox_id))

    def _shown(self, claim: Claim) -> SandboxInfo:
        """The sandbox as `get` and `list` show it: "stopped" once its container has (killed on the host, out of
        memory), until a reset. A claim with a call in flight may be restarting in place, so it shows running."""
        info = claim.info()
        if info.state == "running" and not claim.busy:
            try:
                if self.engine.stopped(claim.container_id):
                    info.state = "stopped"
            except (SandboxNotFound, OSError):  # deleted meanwhile, or out of descriptors: nothing to tell
                pass
        return info

    def _new_id(self) -> str:
        return self._id_prefix + secrets.token_hex(8)

    async def delete(self, tenant: str, sandbox_id: str) -> None:
        """Forgets the claim on the event loop, answering once that is written; its container goes in the
        background. A reset, fork, snapshot or pause holding the claim is waited for in a thread instead."""
        claim = self.held.get(tenant, sandbox_id)
        if not claim.lock.acquire(blocking=False):
            await to_thread.run_sync(self.held.end, claim)
            return
        try:
            removed = self.held.unlist(claim)
        finally:
            claim.lock.release()
        if removed:
            await self._writer.delete(claim)
            self.deletions.later(claim.container_id)

    def _warm(self) -> list[str]:
        return [container_id for pool in list(self.resources.pools.values()) for container_id in list(pool.ready)]

    async def exec(self, tenant: str, sandbox_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult:
        async with self.held.calling(tenant, sandbox_id, "running commands") as claim:
            return await self.engine.exec_async(
                claim.container_id, request.command, timeout=request.timeout, env=environment(claim, request.env),
                cwd=request.cwd, user=request.user, stdin=request.stdin, output_limit=request.output_limit,
                isolated=request.isolated, on_stdout=on_stdout, on_stderr=on_stderr)

    async def reset(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return await to_thread.run_sync(self._reset, self.held.get(tenant, sandbox_id))

    def _reset(self, claim: Claim) -> SandboxInfo:
        with self.held.using(claim), self.held.holding(claim):
            snapshot = snapshot_key(claim.tenant, claim.snapshot) if claim.snapshot else None
            own = Limits(**claim.limits) if claim.limits else None
            cold = snapshot or claim.volumes or own or determinism.needs_cold(self.engine, claim.template, claim.seed)
            warm = None if cold else self.resources.take_warm(claim.template, claim.warmpool)
            try:
                mounts = self.node_volumes.engine_mounts(claim.tenant, claim.volumes)
                container_id = warm or self.resources.start_cold(claim.template, snapshot, mounts, own,
                                                                 seed=claim.seed)
            except (CapacityExceeded, NotFound):
                # No room for a second container, or its template or snapshot is gone: restart this one in place.
                self.held.thaw(claim)
                self.engine.reset(claim.container_id)
                self.store.put_claims([claim])
                self.gateway.move(claim.sandbox_id, claim.container_id)
                return claim.info()
            if claim.network:
                self._narrow(container_id, claim.network)
            self.costs.switch(claim.sandbox_id, container_id)
            old, claim.container_id, claim.paused = claim.container_id, container_id, None
            determinism.start(self.engine, claim, claim.seed)  # the seed's start again
            self.store.put_claims([claim], released=[old])
            self.gateway.move(claim.sandbox_id, container_id)
        self.deletions.later(old)
        return claim.info()

    async def fork(self, tenant: str, sandbox_id: str, count: int) -> list[SandboxInfo]:
        if not 1 <= count <= MAX_FORK:
            raise InvalidRequest(f"fork count must be between 1 and {MAX_FORK}")
        return await to_thread.run_sync(self._fork, self.held.get(tenant, sandbox_id), count)

    def _fork(self, parent: Claim, count: int) -> list[SandboxInfo]:
        with self.held.using(parent), self.held.holding(parent):
            self.capacity.take_quota(parent.tenant, count)
            try:
                self.capacity.reserve(count)
                try:
                    self.held.thaw(parent)
                    containers = self.engine.fork(parent.container_id, count)
                except BaseException:
                    self.capacity.release(count)
                    raise
            except BaseException:
                self.capacity.give_quota(parent.tenant, count)
                raise
            now, idle_clock = time.time(), time.monotonic()
            children = [Claim(
                sandbox_id=self._new_id(), tenant=parent.tenant, container_id=container.id,
                template=parent.template, created_at=now, warmpool=parent.warmpool, snapshot=parent.snapshot,
                shutdown_after=parent.shutdown_after,
                expires_at=now + parent.shutdown_after if parent.shutdown_after else None,
                idle_pause_after=parent.idle_pause_after, env=dict(parent.env), labels=dict(parent.labels),
                parent=parent.sandbox_id, last_used=idle_clock, volumes=read_only(parent.volumes),
                memory=self.engine.carries_memory(container.id), seed=container.info.seed,
                template_digest=parent.template_digest, network=parent.network, lease=parent.lease,
                lease_ttl=parent.lease_ttl,
            ) for container in containers]
            for child in children:
                self.node_volumes.hold(child.tenant, child.sandbox_id, child.volumes)
                if child.network:
                    self._narrow(child.container_id, child.network)
            self.store.put_claims([parent, *children])
            self.held.add(children)
            for child in children:
                self.costs.open(child.sandbox_id, child.container_id)
        return [child.info() for child in children]

    async def pause(self, tenant: str, sandbox_id: str, memory: bool = True) -> SandboxInfo:
        return await to_thread.run_sync(self._set_paused, self.held.get(tenant, sandbox_id), "user", memory)

    async def resume(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return await to_thread.run_sync(self._set_paused, self.held.get(tenant, sandbox_id), None)

    async def set_shutdown_after(self, tenant: str, sandbox_id: str, seconds: float) -> SandboxInfo:
        claim = self.held.get(tenant, sandbox_id)
        claim.shutdown_after, claim.expires_at = seconds, time.time() + seconds
        await self._writer.put(claim)
        return claim.info()

    async def model_calls(self, tenant: str, sandbox_id: str, offset: int = 0) -> ModelCallLog:
        self.held.get(tenant, sandbox_id)
        return self.gateway.log(sandbox_id, offset)

    async def stats(self, tenant: str, sandbox_id: str) -> SandboxStats:
        claim = self.held.get(tenant, sandbox_id)
        with as_sandbox(claim):
            return await to_thread.run_sync(lambda: self.engine.stats(claim.container_id).model_copy(
                update={"cost": self.costs.cost(claim.sandbox_id)}))

    def _set_paused(self, claim: Claim, paused: str | None, memory: bool = True) -> SandboxInfo:
        with self.held.holding(claim), as_sandbox(claim):
            if paused:
                self.engine.pause(claim.container_id, memory)
            else:
                self.engine.resume(claim.container_id)
            claim.paused = paused
            claim.last_used = time.monotonic()
            self.store.put_claims([claim])
        return claim.info()

    # -- volumes (docs/volumes.md; the rules are rollbox.node.volumes') ----------------------------

    async def create_volume(self, tenant: str, request: VolumeRequest) -> VolumeInfo:
        return await to_thread.run_sync(self.node_volumes.create, tenant, request)

    async def volumes(self, tenant: str) -> list[VolumeInfo]:
        return await to_thread.run_sync(self.node_volumes.list, tenant)

    async def volume(self, tenant: str, name: str) -> VolumeInfo:
        return await to_thread.run_sync(self.node_volumes.get, tenant, name)

    async def delete_volume(self, tenant: str, name: str) -> None:
        await to_thread.run_sync(self.node_volumes.delete, tenant, name)

    # -- operations -------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        named = {"node": self.name} if self.name else {}
        return {**named, "sandboxes": self.capacity.count, "max_sandboxes": self.capacity.max_sandboxes,
                "claims": len(self.held.claims), "pools": self.resources.health()}

    async def forget_claims(self) -> int:
        """Deletes every claim and its sandbox: the cluster declared them lost while this node was away, and their
        tenants were told so. Returns how many went."""
        with self.held.lock:
            claims = list(self.held.claims.values())
        for claim in claims:
            with contextlib.suppress(SandboxNotFound):
                await self.delete(claim.tenant, claim.sandbox_id)
        return len(claims)

    def close(self) -> None:
        """Stops background work and waits for it. Containers and claims stay for the next node."""
        self.closed.set()
        self.gateway.shutdown()
        self._sweeper.join()
        self.costs.join()
        self.resources.close()
        self.deletions.close()
        self.node_images.close()
        self.store.close()
