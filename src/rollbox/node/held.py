"""The claims a node holds, by sandbox id: found for their tenant, marked in use by each call, and dropped with
everything they hold.

A claim holds a tenant's quota, a cost meter and its volumes as well as its container. A call on it counts as
use (an idle claim is one with no call in flight) and wakes it first if it was paused for idleness. Dropping it
gives back what it holds, then forgets its record and deletes its container (`end`), or only forgets it when its
container vanished (`lose`). The node, its sweeper and its recovery share this table.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

from anyio import to_thread

from rollbox.engine import Engine
from rollbox.errors import SandboxNotRunning
from rollbox.node.capacity import Capacity
from rollbox.node.claims import Claim, as_sandbox, gone
from rollbox.node.cost import CostMeters
from rollbox.node.deletions import Deletions
from rollbox.node.store import NodeStore
from rollbox.node.volumes import NodeVolumes


class HeldClaims:
    """Thread-safe: `lock` guards `claims` and every claim's `busy` and `paused`."""

    def __init__(self, engine: Engine, store: NodeStore, capacity: Capacity, costs: CostMeters,
                 volumes: NodeVolumes, deletions: Deletions, released: Callable[[str], None] = lambda _: None
                 ) -> None:
        """`released` is told each sandbox id whose claim ends (its model gateway closes)."""
        self.engine = engine
        self.store = store
        self.capacity = capacity
        self.costs = costs
        self.volumes = volumes
        self.deletions = deletions
        self.released = released
        self.claims: dict[str, Claim] = {}
        """The claims, by sandbox id."""
        self.lock = threading.Lock()

    def get(self, tenant: str, sandbox_id: str) -> Claim:
        """The claim of `sandbox_id` if `tenant` holds it; another tenant's sandbox is not found."""
        claim = self.claims.get(sandbox_id)
        if claim is None or claim.tenant != tenant:
            raise gone(sandbox_id)
        claim.unconfirmed = 0.0  # its tenant knows it
        return claim

    def busy(self, sandbox_id: str) -> bool:
        claim = self.claims.get(sandbox_id)
        return claim is not None and claim.busy > 0

    def add(self, claims: list[Claim]) -> None:
        with self.lock:
            self.claims.update((claim.sandbox_id, claim) for claim in claims)

    # -- calls --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def calling(self, tenant: str, sandbox_id: str, doing: str) -> AsyncIterator[Claim]:
        """`using` for a call made on the event loop: the claim, refused while its user has it paused, woken in a
        thread when it is paused for idleness."""
        claim = self.get(tenant, sandbox_id)
        if claim.paused == "user":
            raise SandboxNotRunning(f"is paused: resume it before {doing}", sandbox_id=sandbox_id)
        with self.lock:
            claim.busy += 1
            idle = claim.paused == "idle"
        try:
            if idle:
                await to_thread.run_sync(self.wake, claim)
            with as_sandbox(claim):
                yield claim
        finally:
            with self.lock:
                claim.busy -= 1
                claim.last_used = time.monotonic()

    @contextlib.contextmanager
    def using(self, claim: Claim) -> Iterator[None]:
        """Marks a call in flight (so the claim is not idle), wakes an idle-paused container first, and tells the
        engine's errors about the container as the sandbox's."""
        with self.lock:
            claim.busy += 1
        try:
            with as_sandbox(claim):
                self.wake(claim)
                yield
        finally:
            with self.lock:
                claim.busy -= 1
                claim.last_used = time.monotonic()

    def wake(self, claim: Claim) -> None:
        """Resumes a container paused for idleness."""
        if claim.paused != "idle":
            return
        with claim.lock, as_sandbox(claim):
            if claim.paused == "idle":
                self.engine.resume(claim.container_id)
                claim.paused = None
                self.store.put_claims([claim])

    @contextlib.contextmanager
    def holding(self, claim: Claim) -> Iterator[None]:
        """The claim's lock, provided nobody deleted the claim (or let it expire) while we waited for it."""
        with claim.lock:
            if claim.sandbox_id not in self.claims:
                raise gone(claim.sandbox_id)
            yield

    def thaw(self, claim: Claim) -> None:
        """Resumes a paused container before the engine stops it (fork, snapshot, reset restart it running)."""
        if claim.paused:
            self.engine.resume(claim.container_id)
            claim.paused = None

    # -- dropping claims ----------------------------------------------------------------------

    def unlist(self, claim: Claim) -> bool:
        """Drops the claim from memory and gives back its quota, meter and volumes (call holding its lock); False
        if already gone."""
        with self.lock:
            if self.claims.pop(claim.sandbox_id, None) is None:
                return False
        self.capacity.give_quota(claim.tenant, 1)
        self.costs.close(claim.sandbox_id, claim.tenant)
        self.volumes.release(claim.sandbox_id)
        self.released(claim.sandbox_id)
        return True

    def end(self, claim: Claim) -> None:
        """Ends a claim from a thread (deleted while busy, or expired): forgets it, then deletes its container."""
        with claim.lock:
            if not self.unlist(claim):
                return
            self.store.delete_claim(claim)
        self.deletions.later(claim.container_id)

    def lose(self, claim: Claim) -> None:
        """Forgets a claim whose container the engine no longer has, and the room that container took (call holding
        its lock)."""
        if self.unlist(claim):
            self.store.delete_claim(claim)
            self.capacity.release(1)
