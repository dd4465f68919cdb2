"""A warm pool of a cluster: its replicas in total, kept by its nodes in shares.

Each node keeps its share as a warm pool of its own, whose labels carry the cluster's totals and when they were
applied. So the nodes are where a cluster's pools are written down: a router that starts, or another replica of
it, reads them back from any node, and the newest application wins.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from rollbox.cluster.view import NodeState
from rollbox.errors import InvalidResource
from rollbox.spec import API_VERSION, Metadata, SandboxWarmPool, TemplateRef, WarmPoolSpec

PREFIX = "rollbox.io/cluster-"
REPLICAS = PREFIX + "replicas"
MAX_REPLICAS = PREFIX + "max-replicas"
GENERATION = PREFIX + "generation"


@dataclass(frozen=True, slots=True)
class ClusterPool:
    name: str
    template: str
    replicas: int
    max_replicas: int | None
    refill_concurrency: int
    generation: int
    labels: dict[str, str]
    """The user's own labels, without the cluster's."""

    @classmethod
    def applied(cls, resource: SandboxWarmPool) -> ClusterPool:
        spec, metadata = resource.spec, resource.metadata
        if spec.sandbox_template_ref is None:
            raise InvalidResource(f"SandboxWarmPool {metadata.name}: on a cluster a warm pool names a template: apply "
                                  f"one whose base is the image (base: docker://{spec.image}) and pool that")
        return cls(metadata.name, spec.sandbox_template_ref.name, spec.replicas, spec.max_replicas,
                   spec.refill_concurrency, time.time_ns(), _own(metadata.labels))

    def same_as(self, other: ClusterPool) -> bool:
        """Whether `other` asks for what this pool does (its generation aside): applying it changes nothing."""
        return (self.template, self.replicas, self.max_replicas, self.refill_concurrency, self.labels) == (
            other.template, other.replicas, other.max_replicas, other.refill_concurrency, other.labels)

    def share(self, replicas: int) -> SandboxWarmPool:
        """The warm pool a node keeps for `replicas` of this one; it may grow in bursts as the whole may."""
        burst = None
        if self.max_replicas is not None:
            burst = replicas + ((self.max_replicas - self.replicas) * replicas // self.replicas if self.replicas
                                else 0)
        labels = {**self.labels, REPLICAS: str(self.replicas), GENERATION: str(self.generation)}
        if self.max_replicas is not None:
            labels[MAX_REPLICAS] = str(self.max_replicas)
        return SandboxWarmPool(apiVersion=API_VERSION, kind="SandboxWarmPool",
                               metadata=Metadata(name=self.name, labels=labels),
                               spec=WarmPoolSpec(replicas=replicas, maxReplicas=burst,
                                                 sandboxTemplateRef=TemplateRef(name=self.template),
                                                 refillConcurrency=self.refill_concurrency))

    def kept_by(self, node: NodeState, replicas: int) -> bool:
        """Whether `node` keeps `replicas` of this generation already."""
        held = node.pools.get(self.name)
        return (held is not None and held.get("replicas") == replicas
                and held.get("labels", {}).get(GENERATION) == str(self.generation))


def read_pools(nodes: Iterable[NodeState]) -> dict[str, ClusterPool]:
    """The cluster's pools as the nodes' health reports them: per pool, the newest application any node holds."""
    pools: dict[str, ClusterPool] = {}
    for node in nodes:
        for name, held in node.pools.items():
            labels = held.get("labels") or {}
            if REPLICAS not in labels:
                continue
            generation = int(labels.get(GENERATION, 0))
            if name in pools and pools[name].generation >= generation:
                continue
            most = labels.get(MAX_REPLICAS)
            pools[name] = ClusterPool(name, held["template"], int(labels[REPLICAS]),
                                      int(most) if most is not None else None, held.get("refill_concurrency", 2),
                                      generation, _own(labels))
    return pools


def _own(labels: dict[str, str]) -> dict[str, str]:
    """A pool's labels without the cluster's."""
    return {key: value for key, value in labels.items() if not key.startswith(PREFIX)}
