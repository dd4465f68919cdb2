"""What a restarted node finds: the claims and warm pools it recorded, and the containers the engine adopted.

Every claim gets its container back (one the engine keeps stopped stays so, for a reset) and every pool its
ready ones; whatever neither holds is deleted, and a claim whose container is gone, or a snapshot the engine
lost, is forgotten.

A node killed between recording a claim and answering it cannot tell whether the answer left: the caller may have
claimed elsewhere since (nginx and routers try the next node). So a claim made in the last RECENT seconds before the
node was last alive (`ALIVE`, touched by the sweeper) stays unconfirmed: it ends CONFIRM_WINDOW after the restart
unless a call names it first, or its request key is sent again (docs/faults.md).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from pathlib import Path

from rollbox.engine import Engine
from rollbox.node.capacity import Capacity
from rollbox.node.claims import Claim
from rollbox.node.deletions import Deletions
from rollbox.node.resources import Resources
from rollbox.node.store import NodeStore, snapshot_key
from rollbox.spec import SandboxWarmPool

log = logging.getLogger("rollbox.node")

ALIVE = "node.alive"
"""A file in the data directory whose modification time is when the node was last alive."""
RECENT = 10.0
"""Seconds before the node was last alive in which a claim's answer may not have left."""
CONFIRM_WINDOW = 30.0
"""Seconds after a restart in which a call must name such a claim, or it ends."""


def mark_alive(data_dir: Path) -> None:
    (data_dir / ALIVE).touch()


def recover(engine: Engine, store: NodeStore, capacity: Capacity, resources: Resources, deletions: Deletions
            ) -> list[Claim]:
    """Fills a new node's pools and counts from its store and its engine; returns the claims it holds."""
    try:
        last_alive = (engine.data_dir / ALIVE).stat().st_mtime
    except OSError:
        last_alive = None
    containers = engine.list()
    alive = {info.id for info in containers}
    running = {info.id for info in containers if info.state != "stopped"}
    tenants: Counter[str] = Counter()
    held: set[str] = set()
    claims = []
    for claim in store.claims():
        if claim.container_id not in alive:
            log.warning("sandbox %s lost its container %s: dropping it", claim.sandbox_id, claim.container_id)
            store.delete_claim(claim)
            continue
        claim.last_used = time.monotonic()
        if last_alive is not None and claim.created_at >= last_alive - RECENT:
            claim.unconfirmed = claim.last_used + CONFIRM_WINDOW
        claims.append(claim)
        tenants[claim.tenant] += 1
        held.add(claim.container_id)
    capacity.adopt(len(alive), tenants)

    pools = [SandboxWarmPool.model_validate_json(text) for text in store.pools()]
    names = {pool.metadata.name for pool in pools}
    ready: defaultdict[str, list[str]] = defaultdict(list)
    stale = []
    for container_id, pool in store.pool_containers():  # a claimed container's row stays: its claim wins
        if container_id in running and container_id not in held and pool in names:
            ready[pool].append(container_id)
            held.add(container_id)
        else:
            stale.append(container_id)
    store.remove_pool_containers(stale)
    for pool in pools:
        resources.add_pool(pool, ready[pool.metadata.name])
    for container_ids in ready.values():
        for container_id in container_ids:
            resources.watch(container_id)
    for container_id in alive - held:
        deletions.later(container_id)

    snapshots = {info.name for info in engine.snapshots()}
    for tenant, name, _ in store.snapshots():
        if snapshot_key(tenant, name) not in snapshots:
            store.delete_snapshot(tenant, name)
    return claims
