"""How `LocalNode` makes a claim: a warm container taken on the event loop, or one started cold in a thread; the
claim's record written before it answers; a request key that made a sandbox already answering that sandbox
(node/keys.py); and a sandbox whose answers all found their callers gone ended (`answered`, `withdraw`:
node/answers.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from anyio import to_thread

from rollbox.errors import CapacityExceeded, NoWarmSandbox, SandboxNotFound
from rollbox.models import ClaimRequest, SandboxInfo
from rollbox.node import determinism
from rollbox.node.claims import Claim
from rollbox.node.store import snapshot_key

if TYPE_CHECKING:
    from rollbox.engine import Engine
    from rollbox.node.answers import Answers
    from rollbox.node.capacity import Capacity
    from rollbox.node.cost import CostMeters
    from rollbox.node.deletions import Deletions
    from rollbox.node.gateway import Gateway
    from rollbox.node.held import HeldClaims
    from rollbox.node.images import NodeImages
    from rollbox.node.keys import ClaimKeys
    from rollbox.node.leases import Leases
    from rollbox.node.resources import Resources
    from rollbox.node.volumes import NodeVolumes
    from rollbox.node.writer import ClaimWriter
    from rollbox.spec import Network


class ClaimOperations:
    """`LocalNode`'s claims (a mixin: it uses the node's parts)."""

    name: str | None
    engine: Engine
    answers: Answers
    capacity: Capacity
    costs: CostMeters
    deletions: Deletions
    gateway: Gateway
    held: HeldClaims
    keys: ClaimKeys
    leases: Leases
    node_images: NodeImages
    node_volumes: NodeVolumes
    resources: Resources
    default_shutdown_after: float | None
    _writer: ClaimWriter
    _new_id: Callable[[], str]
    delete: Callable[[str, str], Awaitable[None]]
    _claim_network: Callable[[str, Network | None], Awaitable[dict[str, Any] | None]]

    async def claim(self, tenant: str, request: ClaimRequest, *, warm_only: bool = False, retry: bool = False
                    ) -> SandboxInfo:
        """Takes a warm container on the event loop; only a cold start goes to a thread. A claim with a request key
        that made a sandbox already (or is making one) answers that sandbox (node/keys.py), sent again (`retry`) or
        not."""
        key = request.request_key
        if key is None:
            return await self._claim(tenant, request, warm_only)
        found = await self.keys.find(tenant, key)
        if found is not None:
            return found
        with self.keys.making(tenant, key) as made:
            info = await self._claim(tenant, request, warm_only)
            made(info)
        return info

    async def _claim(self, tenant: str, request: ClaimRequest, warm_only: bool) -> SandboxInfo:
        if warm_only and (request.snapshot or request.volumes or request.warmpool not in self.resources.pools):
            raise NoWarmSandbox(f"node {self.name} takes this claim from no warm pool of its own")
        self.deletions.last_claim = time.monotonic()
        template = await self.node_images.template_for(tenant, request, self.resources.pool) if request.image else \
            self.resources.template_for(request)
        limits = self.resources.claim_limits(template, request.limits)
        snapshot = snapshot_key(tenant, request.snapshot) if request.snapshot else None
        sandbox_id = self._new_id()
        volumes = self.node_volumes.mounts_for(template, snapshot, request.volumes)
        try:
            self.capacity.take_quota(tenant, 1)
        except CapacityExceeded as error:
            raise NoWarmSandbox(str(error)) if warm_only else error from None
        try:
            if volumes:  # held before the container starts: a second writer is refused at once
                await to_thread.run_sync(self.node_volumes.reserve, tenant, sandbox_id, volumes)
            cold = snapshot or volumes or limits or determinism.needs_cold(self.engine, template, request.seed)
            warm = None if cold else self.resources.take_warm(template, request.warmpool, count_miss=not warm_only)
            if warm is None and warm_only:
                raise NoWarmSandbox(f"node {self.name} has no ready warm sandbox for this claim")
            container_id = warm or await to_thread.run_sync(self.resources.start_cold, template, snapshot,
                                                            self.node_volumes.engine_mounts(tenant, volumes), limits,
                                                            request.seed)
            try:
                template = template or self.engine.info(container_id).template
                env = request.env or {}
                gateway = self.gateway.config_for(request.model_gateway, template)
                if gateway is not None:
                    env = {**env, **await self.gateway.open(sandbox_id, container_id, gateway)}
                network = await self._claim_network(container_id, request.network)
                claim = self._claim_of(tenant, request, sandbox_id, container_id, template, volumes, env=env,
                                       network=network, limits=limits.model_dump() if limits else None)
                await determinism.start_async(self.engine, claim, request.seed)
                await self._writer.put(claim)
            except BaseException:
                self.gateway.close(sandbox_id)
                self.deletions.discard([container_id])
                raise
        except BaseException:
            self.capacity.give_quota(tenant, 1)
            self.node_volumes.release(sandbox_id)
            raise
        if request.lease is not None:
            self.leases.hold(tenant, request.lease)
        self.held.add([claim])
        self.costs.open(claim.sandbox_id, container_id)
        return claim.info()

    def _claim_of(self, tenant: str, request: ClaimRequest, sandbox_id: str, container_id: str, template: str,
                  volumes: list[dict[str, Any]], *, env: dict[str, str], network: dict[str, Any] | None,
                  limits: dict[str, Any] | None) -> Claim:
        """The record of a claim. One made under no lease that asks for no `shutdown_after` (not even none) ends
        after the node's default."""
        asked = request.lease is not None or "shutdown_after" in request.model_fields_set
        shutdown_after = request.shutdown_after if asked else self.default_shutdown_after
        now = time.time()
        return Claim(
            sandbox_id=sandbox_id, tenant=tenant, container_id=container_id, created_at=now,
            template=template, warmpool=request.warmpool,
            snapshot=request.snapshot, shutdown_after=shutdown_after,
            expires_at=now + shutdown_after if shutdown_after else None,
            idle_pause_after=request.idle_pause_after, labels=request.labels or {},
            last_used=time.monotonic(), volumes=volumes, on_timeout=request.on_timeout or "delete",
            memory=request.snapshot is not None and self.engine.carries_memory(container_id),
            request_key=request.request_key, lease=request.lease and request.lease.id,
            lease_ttl=request.lease and request.lease.ttl, env=env, network=network, limits=limits)

    async def answered(self, tenant: str, sandbox_id: str, taken: bool, attempt: str | None = None) -> None:
        """An answer carrying the sandbox (a claim's, or a key lookup's) was sent: it ends if this one found its
        caller gone and no other answer carrying it reached one."""
        if self.answers.answered(tenant, sandbox_id, taken, attempt):
            await self._end(tenant, sandbox_id)

    async def withdraw(self, attempts: list[str]) -> None:
        """The callers of `attempts` dropped their answers (a router's edge past its wait, say): a sandbox they
        leave with nobody holding it ends."""
        for tenant, sandbox_id in self.answers.withdraw(attempts):
            await self._end(tenant, sandbox_id)

    async def _end(self, tenant: str, sandbox_id: str) -> None:
        with contextlib.suppress(SandboxNotFound):  # deleted meanwhile
            await self.delete(tenant, sandbox_id)
