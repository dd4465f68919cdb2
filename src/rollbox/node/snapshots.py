"""The `Node` interface's snapshots on this machine: a tenant's sandbox saved under a name of the tenant's, through
the engine (which keeps them under `snapshot_key`, so tenants' names never meet).

Taking one holds the claim as a reset does (the engine stops and starts its container) and counts as a call on
it; the node's store says which tenant holds which name, and from which sandbox it was taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anyio import to_thread

from rollbox.errors import SnapshotNotFound
from rollbox.models import SnapshotInfo
from rollbox.node.claims import Claim
from rollbox.node.store import NodeStore, check_snapshot_name, snapshot_key

if TYPE_CHECKING:
    from rollbox.engine import Engine
    from rollbox.node.held import HeldClaims


class SnapshotOperations:
    """`LocalNode`'s snapshot operations (a mixin: it uses the node's engine, store and claims)."""

    engine: Engine
    store: NodeStore
    held: HeldClaims

    async def snapshot(self, tenant: str, sandbox_id: str, name: str) -> SnapshotInfo:
        check_snapshot_name(name)
        return await to_thread.run_sync(self._snapshot, self.held.get(tenant, sandbox_id), name)

    def _snapshot(self, claim: Claim, name: str) -> SnapshotInfo:
        with self.held.using(claim), self.held.holding(claim):
            self.held.thaw(claim)
            info = self.engine.snapshot(claim.container_id, snapshot_key(claim.tenant, name))
            self.store.put_snapshot(claim.tenant, name, claim.sandbox_id)
            self.store.put_claims([claim])
        return info.model_copy(update={"name": name, "source": claim.sandbox_id})

    async def snapshots(self, tenant: str) -> list[SnapshotInfo]:
        known = {info.name: info for info in self.engine.snapshots()}
        found = []
        for _, name, source in self.store.snapshots(tenant):
            info = known.get(snapshot_key(tenant, name))
            if info is not None:
                found.append(info.model_copy(update={"name": name, "source": source}))
        return found

    async def delete_snapshot(self, tenant: str, name: str) -> None:
        if not any(row[1] == name for row in self.store.snapshots(tenant)):
            raise SnapshotNotFound(f"snapshot {name!r} does not exist")
        await to_thread.run_sync(self.engine.delete_snapshot, snapshot_key(tenant, name))
        self.store.delete_snapshot(tenant, name)
