"""A cluster's warm pools (rollbox.cluster.pools): the share each node keeps, and reading the pools back from the
nodes' health, where they are written down."""

from __future__ import annotations

from typing import Any

from rollbox.cluster.pools import GENERATION, MAX_REPLICAS, REPLICAS, ClusterPool, read_pools
from rollbox.cluster.view import NodeState
from rollbox.spec import SandboxWarmPool, parse_resource


def applied(replicas: int, max_replicas: int | None = None, labels: dict[str, str] | None = None,
            name: str = "rl-python") -> ClusterPool:
    spec: dict[str, Any] = {"replicas": replicas, "sandboxTemplateRef": {"name": "rl-python"},
                            "refillConcurrency": 3}
    if max_replicas is not None:
        spec["maxReplicas"] = max_replicas
    resource = parse_resource({"apiVersion": "rollbox.dev/v1alpha1", "kind": "SandboxWarmPool",
                               "metadata": {"name": name, "labels": labels or {}}, "spec": spec})
    assert isinstance(resource, SandboxWarmPool)
    return ClusterPool.applied(resource)


def as_health_reports(share: SandboxWarmPool, ready: int = 0) -> dict[str, Any]:
    """A node's /healthz entry for the warm pool `share` it keeps."""
    return {"template": share.spec.sandbox_template_ref.name, "replicas": share.spec.replicas, "ready": ready,
            "starting": 0, "refill_concurrency": share.spec.refill_concurrency, "labels": share.metadata.labels}


def node(name: str, pools: dict[str, dict[str, Any]]) -> NodeState:
    return NodeState(name, f"http://{name}:8090", "up", 0.0, max_sandboxes=16, pools=pools)


def test_applied_keeps_the_users_labels_and_drops_the_clusters() -> None:
    pool = applied(8, labels={"team": "rl", REPLICAS: "999", GENERATION: "1"})
    assert (pool.name, pool.template, pool.replicas, pool.max_replicas, pool.refill_concurrency) == (
        "rl-python", "rl-python", 8, None, 3)
    assert pool.labels == {"team": "rl"}
    assert applied(8).generation > pool.generation, "a later application is newer"


def test_a_share_carries_the_totals_in_its_labels() -> None:
    pool = applied(8, labels={"team": "rl"})
    share = pool.share(5)
    assert (share.metadata.name, share.spec.replicas, share.spec.max_replicas) == ("rl-python", 5, None)
    assert (share.spec.sandbox_template_ref.name, share.spec.refill_concurrency) == ("rl-python", 3)
    assert share.metadata.labels == {"team": "rl", REPLICAS: "8", GENERATION: str(pool.generation)}


def test_a_share_bursts_in_proportion_to_the_whole() -> None:
    pool = applied(8, max_replicas=12)
    assert [(pool.share(n).spec.replicas, pool.share(n).spec.max_replicas) for n in (0, 3, 4, 5, 8)] == [
        (0, 0), (3, 4), (4, 6), (5, 7), (8, 12)]
    assert pool.share(5).metadata.labels[MAX_REPLICAS] == "12"
    assert applied(0, max_replicas=6).share(0).spec.max_replicas == 0
    assert MAX_REPLICAS not in applied(8).share(5).metadata.labels


def test_kept_by_a_node_with_that_share_of_that_generation() -> None:
    pool = applied(8)
    keeping = node("alpha", {"rl-python": as_health_reports(pool.share(5))})
    assert pool.kept_by(keeping, 5)
    assert not pool.kept_by(keeping, 4)
    assert not applied(8).kept_by(keeping, 5), "a newer application is not kept yet"
    assert not pool.kept_by(node("alpha", {}), 5)


def test_read_pools_takes_the_newest_application_any_node_holds() -> None:
    older, newer = applied(8, labels={"v": "1"}), applied(4, max_replicas=6, labels={"v": "2"})
    nodes = [node("alpha", {"rl-python": as_health_reports(newer.share(2))}),
             node("beta", {"rl-python": as_health_reports(older.share(3))}),
             node("gamma", {"rl-python": as_health_reports(older.share(3))})]
    for order in (nodes, nodes[::-1]):
        assert read_pools(order) == {"rl-python": newer}


def test_read_pools_ignores_pools_a_router_did_not_place() -> None:
    """A node's own pool (applied to the node agent directly) has no cluster labels: not the cluster's."""
    placed = applied(8, name="placed")
    own = {"template": "rl-python", "replicas": 2, "ready": 2, "starting": 0, "labels": {"team": "rl"}}
    nodes = [node("alpha", {"own": own, "bare": {"template": "rl-python", "replicas": 1},
                            "placed": as_health_reports(placed.share(5))})]
    assert read_pools(nodes) == {"placed": placed}
    assert read_pools([]) == {}


def test_read_pools_without_a_generation_or_refill_label_reads_defaults() -> None:
    held = {"template": "rl-python", "replicas": 2, "labels": {REPLICAS: "4"}}
    (pool,) = read_pools([node("alpha", {"p": held})]).values()
    assert (pool.replicas, pool.max_replicas, pool.generation, pool.refill_concurrency, pool.labels) == (
        4, None, 0, 2, {})
