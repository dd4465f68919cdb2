"""Leases: a trainer's hold on the sandboxes it claims under one (`ClaimRequest.lease`), renewed by its heartbeats; when
the trainer stops renewing it (it crashed) or closes it, those sandboxes end (docs/faults.md).

Each node keeps the leases of its own claims, by tenant and id (the trainer's). A claim under a lease the node does
not know opens it here for the claim's `ttl`; a renewal of a lease the node does not know is ignored (it holds
nothing under it). The claims record their lease, so a node restarted finds its leases again, each renewed from
then.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anyio import to_thread

from rollbox.models import LeaseInfo, LeaseRef

if TYPE_CHECKING:
    from rollbox.node.claims import Claim
    from rollbox.node.held import HeldClaims

Key = tuple[str, str]
"""(tenant, lease id)."""


@dataclass
class Lease:
    id: str
    ttl: float
    expires_at: float
    """Wall-clock time it ends unless renewed."""


class Leases:
    """Thread-safe: claims open leases on the event loop, the sweeper ends them in its thread."""

    def __init__(self) -> None:
        self._leases: dict[Key, Lease] = {}
        self._lock = threading.Lock()

    def adopt(self, claims: list[Claim]) -> None:
        """The leases of the claims a restarted node found, each lasting its ttl from now."""
        for claim in claims:
            if claim.lease and claim.lease_ttl:
                self.hold(claim.tenant, LeaseRef(id=claim.lease, ttl=claim.lease_ttl))

    def hold(self, tenant: str, ref: LeaseRef) -> None:
        """A claim under `ref`: the lease opens if the node did not know it, and lasts at least `ttl` from now (a
        claim is a sign of its trainer's life)."""
        ends = time.time() + ref.ttl
        with self._lock:
            lease = self._leases.get((tenant, ref.id))
            if lease is None:
                self._leases[(tenant, ref.id)] = Lease(ref.id, ref.ttl, ends)
            elif lease.expires_at < ends:
                lease.expires_at = ends

    def renew(self, tenant: str, lease_id: str, ttl: float) -> Lease | None:
        """The lease, lasting `ttl` from now; None if this node holds nothing under it."""
        with self._lock:
            lease = self._leases.get((tenant, lease_id))
            if lease is not None:
                lease.ttl, lease.expires_at = ttl, time.time() + ttl
            return lease

    def close(self, tenant: str, lease_id: str) -> Lease | None:
        with self._lock:
            return self._leases.pop((tenant, lease_id), None)

    def ended(self, now: float) -> set[Key]:
        """Leases past their end, forgotten here: their claims are to end."""
        with self._lock:
            gone = {key for key, lease in self._leases.items() if lease.expires_at <= now}
            for key in gone:
                del self._leases[key]
        return gone



class LeaseOperations:
    """`LocalNode`'s leases (a mixin: it uses the node's claims)."""

    leases: Leases
    held: HeldClaims

    async def renew_lease(self, tenant: str, lease_id: str, ttl: float) -> LeaseInfo:
        lease = self.leases.renew(tenant, lease_id, ttl)
        expires_at = time.time() + ttl if lease is None else lease.expires_at
        return LeaseInfo(id=lease_id, ttl=ttl, expires_at=expires_at, sandboxes=len(self._under(tenant, lease_id)))

    async def close_lease(self, tenant: str, lease_id: str) -> None:
        """Ends the lease and every sandbox claimed under it here."""
        self.leases.close(tenant, lease_id)
        claims = self._under(tenant, lease_id)
        if claims:
            await to_thread.run_sync(lambda: [self.held.end(claim) for claim in claims])

    def _under(self, tenant: str, lease_id: str) -> list[Claim]:
        return [claim for claim in list(self.held.claims.values())
                if claim.lease == lease_id and claim.tenant == tenant]
