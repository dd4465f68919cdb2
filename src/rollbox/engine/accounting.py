"""What a claim's cost is accounted from: one look at its container's cgroup counters and its upper's use.

Reads the fewest files that serve: the CPU counter alone when a claim starts on a warm container (on the
claim's hot path), all three when the node samples a claim (rollbox.node.cost).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollbox.engine.cgroups import Cgroups
from rollbox.engine.layers import LayerStore
from rollbox.engine.store import ContainerRecord


@dataclass(frozen=True, slots=True)
class Usage:
    cgroup: str
    """Whose counters these are: a restarted container has a new cgroup, whose CPU counter starts at zero."""
    cpu_seconds: float
    memory_bytes: int = 0
    disk_bytes: int = 0


def cpu_usage(cgroups: Cgroups, record: ContainerRecord) -> Usage:
    return Usage(record.oci_id, cgroups.cpu_seconds(record.oci_id))


def usage(cgroups: Cgroups, layers: LayerStore, record: ContainerRecord) -> Usage:
    name = record.oci_id
    return Usage(name, cgroups.cpu_seconds(name), cgroups.memory_current(name), layers.upper_bytes(record.upper))
