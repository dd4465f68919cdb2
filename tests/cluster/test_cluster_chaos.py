"""Chaos under load (tests/support/chaos.py): 32 clients claim, write, read back, hold and delete while the router is
killed and started again, a node agent is killed and started again, one is frozen (SIGSTOP), and one is killed for
good, in a cluster of three node agents behind a router with nginx at its edge. Nothing is lost, nothing is left
that no client holds, nothing waits on the frozen node, the dead node answers at once, and no log has a traceback
(docs/faults.md; bench/cluster.py measures the same faults against the issue's figures)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox import errors
from rollbox.client import SandboxClient
from rollbox.cluster.view import RESTART_WAIT
from rollbox.node.recovery import CONFIRM_WINDOW, RECENT
from tests.support.chaos import Load, first_traceback, freeze, orphans, resources, tracebacks
from tests.support.cluster import ADMINS, TOKENS, Cluster, claim_on_every_node, router_health, running_cluster, wait_for

pytestmark = pytest.mark.slow

NODES = {"alpha": 16, "beta": 16, "gamma": 16}
POOL = "chaos"
CLIENTS = 32
FROZEN = 5.0
"""Seconds a node stays stopped: a claim that waited for it would take at least this long."""
WITHDRAWN_WITHIN = 5.0
"""Seconds after the load settled by which a thawed node has ended what it made for nobody."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("chaos"), NODES, tokens=TOKENS, admins=ADMINS) as cluster:
        with SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
            client.apply(resources(POOL))
            wait_for(lambda: client.get_warmpool(POOL).ready == 12, "the warm pool full")
        yield cluster


def under_load(cluster: Cluster, seconds: float) -> Load:
    load = Load(cluster.url, TOKENS["alice"], POOL, clients=CLIENTS, hold=0.2).start()
    time.sleep(seconds)
    return load


def settled(cluster: Cluster, load: Load, gone: tuple[str, ...] = ()) -> None:
    """The load stopped and settled (`stopped`), and nothing left that no client holds."""
    stopped(cluster, load, gone)
    left = orphans(cluster, "alice", gone)
    assert left == [], (left, load.errors, time.time(), [claim for claim in load.claims if claim.error])


def stopped(cluster: Cluster, load: Load, gone: tuple[str, ...] = ()) -> None:
    """The load stopped and settled: nothing lost, and every answer was one a caller must expect: no log of any
    process has a traceback."""
    load.stop()
    load.settle(gone)
    assert load.lost == [], load.lost
    no_tracebacks(cluster)


def no_tracebacks(cluster: Cluster) -> None:
    logs = sorted(Path(cluster.root).glob("*.log"))
    assert sum(tracebacks(logs).values()) == 0, first_traceback(logs)


def test_a_router_killed_under_claims_leaves_no_sandbox_nobody_holds(cluster: Cluster) -> None:
    """Claims cut off by the router's death are sent again with their request keys and answered by the restarted
    router, or ended by their nodes (their caller hung up): none is left that no client holds."""
    load = under_load(cluster, 3)
    cluster.routers[0].kill()
    cluster.routers[0].start()
    time.sleep(3)
    settled(cluster, load)
    assert sum(claim.error is None for claim in load.claims) > CLIENTS, load.errors


def test_a_node_agent_killed_and_started_again_loses_nothing(cluster: Cluster) -> None:
    """Its sandboxes read back once it is back; the claims of its last moments, whose answers may never have left,
    end on their own unless named (node/recovery.py)."""
    load = under_load(cluster, 3)
    cluster.nodes["beta"].kill()
    time.sleep(1)
    cluster.nodes["beta"].start()
    restarted = time.monotonic()
    time.sleep(3)
    stopped(cluster, load)
    wait_for(lambda: not orphans(cluster, "alice"), "the unconfirmed claims ended",
             CONFIRM_WINDOW + RECENT - (time.monotonic() - restarted) + 10)


def test_a_frozen_node_stalls_no_claim(cluster: Cluster) -> None:
    """nginx asks a node for a warm sandbox for WARM_WAIT at most and leaves it out of the turn when it fails; the
    router stops placing claims there once it stops answering: no claim waits for the frozen node (one that did
    would land there once it thaws), and the claims it made for callers that gave up end."""
    load = under_load(cluster, 3)
    frozen = freeze(cluster.nodes["alpha"], FROZEN)
    time.sleep(2)
    before = [claim.seconds for claim in load.between(0, frozen) if claim.error is None]
    during = [claim for claim in load.between(frozen, frozen + FROZEN) if claim.error is None]
    stopped(cluster, load)
    assert during and not [claim for claim in during if claim.node == "alpha"], during
    assert max(claim.seconds for claim in during) < FROZEN + max(before), (sorted(before)[-3:], during)
    # the claims it made for callers that gave up end: at once, or when the router's withdrawals reach it
    wait_for(lambda: not orphans(cluster, "alice"), "the frozen node's claims nobody holds ended", WITHDRAWN_WITHIN)


def test_a_node_killed_for_good_answers_at_once(cluster: Cluster) -> None:
    with SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
        held = claim_on_every_node(client, POOL, NODES)
        victim = held.pop("gamma")
        for sandbox in held.values():
            sandbox.delete()
        load = under_load(cluster, 2)
        cluster.nodes["gamma"].kill()
        took = []
        for _ in range(5):
            started = time.monotonic()
            with pytest.raises(errors.NodeUnavailable) as raised:
                client.get_sandbox(victim.id)
            took.append(time.monotonic() - started)
            assert raised.value.retry is False  # not sent again by the SDK
        assert took[0] <= RESTART_WAIT + 1.0 and max(took[1:]) < 0.5, took
        assert router_health(cluster.url)["nodes"]["gamma"]["status"] == "unreachable"
        time.sleep(2)
        settled(cluster, load, gone=("gamma",))
