"""What a restarted node finds: the claims and warm pools it recorded, and the containers the engine adopted.

Every claim gets its container back and every pool its ready ones; whatever neither holds is deleted,
and a claim whose container is gone, or a snapshot the engine lost, is forgotten.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from rollbox.node.store import snapshot_key
from rollbox.spec import SandboxWarmPool

if TYPE_CHECKING:
    from rollbox.node.local import LocalNode

log = logging.getLogger("rollbox.node")


def recover(node: LocalNode) -> None:
    """Fills a new node's claims, pools and counts from its store and its engine."""
    engine, store = node.engine, node.store
    alive = {info.id for info in engine.list()}
    tenants: Counter[str] = Counter()
    held: set[str] = set()
    for claim in store.claims():
        if claim.container_id not in alive:
            log.warning("sandbox %s lost its container %s: dropping it", claim.sandbox_id, claim.container_id)
            store.delete_claim(claim)
            continue
        claim.last_used = time.monotonic()
        node.claimed[claim.sandbox_id] = claim
        tenants[claim.tenant] += 1
        held.add(claim.container_id)
    node.capacity.adopt(len(alive), tenants)

    resources = [SandboxWarmPool.model_validate_json(text) for text in store.pools()]
    names = {resource.metadata.name for resource in resources}
    ready: defaultdict[str, list[str]] = defaultdict(list)
    stale = []
    for container_id, pool in store.pool_containers():  # a claimed container's row stays: its claim wins
        if container_id in alive and container_id not in held and pool in names:
            ready[pool].append(container_id)
            held.add(container_id)
        else:
            stale.append(container_id)
    store.remove_pool_containers(stale)
    for resource in resources:
        node.resources.add_pool(resource, ready[resource.metadata.name])
    for container_ids in ready.values():
        for container_id in container_ids:
            node.resources.watch(container_id)
    for container_id in alive - held:
        node.deletions.later(container_id)

    snapshots = {info.name for info in engine.snapshots()}
    for tenant, name, _ in store.snapshots():
        if snapshot_key(tenant, name) not in snapshots:
            store.delete_snapshot(tenant, name)
