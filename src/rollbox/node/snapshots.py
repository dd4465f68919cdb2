"""The `Node` interface's snapshots on this machine: a sandbox's files (and with gVisor its processes and memory)
saved under a tenant's name, for claims to start from (`ClaimRequest.snapshot`). Each tenant names its snapshots
independently (`snapshot_key`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anyio import to_thread
from pydantic import ValidationError

from rollbox.errors import InvalidRequest, SnapshotNotFound
from rollbox.models import SnapshotInfo
from rollbox.node.claims import Claim
from rollbox.node.store import snapshot_key
from rollbox.spec import Metadata

if TYPE_CHECKING:
    from rollbox.engine import Engine
    from rollbox.node.held import HeldClaims
    from rollbox.node.store import NodeStore


class SnapshotOperations:
    """`LocalNode`'s snapshots (a mixin: it uses the node's claims, store and engine)."""

    engine: Engine
    held: HeldClaims
    store: NodeStore

    async def snapshot(self, tenant: str, sandbox_id: str, name: str) -> SnapshotInfo:
        try:
            Metadata(name=name)
        except ValidationError:
            raise InvalidRequest(f"snapshot name {name!r}: use lowercase letters, digits, '-' or '.', "
                                 "at most 63 characters") from None
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
