"""The faults phase of bench/cluster.py (issue 33's targets): a cluster of three node agents (`rollbox node`) behind a
router with nginx at its edge, 32 async SDK clients claiming, writing, reading back, holding and deleting throughout
(tests/support/chaos.py, the cluster tier's own chaos), while:

1. the router is SIGKILLed and started again: the sandboxes the nodes hold that no client holds, after the clients'
   retries, are counted at once (target 0);
2. a node agent is SIGKILLed and started again: its sandboxes read back (lost: target 0), and the claims of its
   last moments, whose answers may never have left, end on their own (counted once its confirmation window passed);
3. a node agent is SIGSTOPped for FROZEN seconds: the claims started meanwhile, their p50 and p99;
4. that node is killed for good: the first call on one of its sandboxes (raw HTTP) and `get_sandbox` through the
   SDK, both sent at once, how long they took; then later calls, one at a time;
5. the same load with that node gone, for FROZEN seconds: the claims' p50 and p99, against which step 3's p99 is held
   (target: within 2x, in the same run);

and last, every log of every process is searched for tracebacks (target 0). The load runs CHAOS seconds or more in
all.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
from rich.progress import Progress

from common import Figures, distribution, load
from rollbox import errors
from rollbox.client import SandboxClient
from rollbox.node.recovery import CONFIRM_WINDOW, RECENT

REPO = Path(__file__).resolve().parents[1]
"""Where tests/support/ is found: the chaos is the cluster tier's own (first: a dependency ships a `tests` package)."""
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.chaos import Load, freeze, orphans, resources, tracebacks  # noqa: E402
from tests.support.cluster import (  # noqa: E402
    ADMINS,
    TOKENS,
    Cluster,
    claim_on_every_node,
    router_health,
    running_cluster,
    wait_for,
)

NODES = {"alpha": 16, "beta": 16, "gamma": 16}
POOL = "faults"
CLIENTS = 32
HOLD = 0.2
"""Seconds each client holds its sandbox before deleting it."""
FROZEN = 10.0
CHAOS = 90.0
"""Seconds of load the phase runs at least."""
LATER_CALLS = 20
WITHDRAWN_WITHIN = 5.0
"""Seconds after the frozen node's load settled before its sandboxes nobody holds are counted."""
ALICE = {"Authorization": f"Bearer {TOKENS['alice']}"}

TARGETS: dict[str, tuple[str, Callable[[float], bool]]] = {
    "faults_router_kill_orphans": ("0 sandboxes no client holds after a router SIGKILL, after retries",
                                   lambda count: count == 0),
    "faults_dead_first_call_s": ("a dead node's first call answers in <= 2 s", lambda s: s <= 2.0),
    "faults_dead_later_call_ms": ("its later calls answer in <= 50 ms (the slowest)", lambda ms: ms <= 50),
    "faults_dead_sdk_get_s": ("get_sandbox through the SDK <= 2.5 s", lambda s: s <= 2.5),
    "faults_frozen_p99_ratio": ("claim p99 with a node frozen <= 2x with it gone", lambda ratio: ratio <= 2.0),
    "faults_frozen_orphans": ("0 sandboxes no client holds made by the frozen node once it thawed",
                              lambda count: count == 0),
    "faults_lost": ("0 sandboxes lost", lambda count: count == 0),
    "faults_tracebacks": (f"0 tracebacks in any log after {CHAOS:.0f} s of chaos", lambda count: count == 0),
}


def measure(root: Path, progress: Progress) -> Figures:
    task = progress.add_task("faults: router, node restart, frozen, dead, gone", total=5)
    figures: Figures = {"faults_load": load()}
    with running_cluster(root, NODES, tokens=TOKENS, admins=ADMINS) as cluster:
        with SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
            client.apply(resources(POOL))
            wait_for(lambda: client.get_warmpool(POOL).ready == 12, "the warm pool full", 120)
        started = time.monotonic()
        lost: list[str] = []
        with loaded(cluster, lost):
            time.sleep(4)
            killed = time.monotonic()
            cluster.routers[0].kill()
            cluster.routers[0].start()
            figures["faults_router_restart_s"] = round(time.monotonic() - killed, 2)
            time.sleep(3)
        figures["faults_router_kill_orphans"] = len(orphans(cluster, "alice"))
        progress.advance(task)

        with loaded(cluster, lost):
            time.sleep(4)
            cluster.nodes["beta"].kill()
            time.sleep(1)
            cluster.nodes["beta"].start()
            restarted = time.monotonic()
            time.sleep(3)
        figures["faults_node_restart_unconfirmed"] = len(orphans(cluster, "alice"))
        progress.advance(task)

        with loaded(cluster, lost) as frozen_load:
            time.sleep(4)
            before = set(orphans(cluster, "alice"))
            figures["faults_frozen_claim_ms"] = frozen(cluster, frozen_load)
        time.sleep(WITHDRAWN_WITHIN)
        figures["faults_frozen_orphans"] = len([orphan for orphan in orphans(cluster, "alice")
                                                if orphan.startswith("alpha-") and orphan not in before])
        progress.advance(task)

        figures.update(dead(cluster))
        progress.advance(task)

        with loaded(cluster, lost, gone=("alpha",)) as gone_load:
            time.sleep(3)
            since = time.monotonic()
            time.sleep(max(FROZEN, CHAOS - (time.monotonic() - started)))
            figures["faults_gone_claim_ms"] = claims_ms(gone_load, since, time.monotonic())
            ended = time.monotonic()
        figures["faults_chaos_s"] = round(time.monotonic() - started, 1)
        figures["faults_claims_per_s"] = round(figures["faults_gone_claim_ms"]["n"] / (ended - since), 1)
        figures["faults_frozen_p99_ratio"] = round(figures["faults_frozen_claim_ms"]["p99"]
                                                   / figures["faults_gone_claim_ms"]["p99"], 2)
        figures["faults_lost"] = len(lost)
        wait_for(lambda: not orphans(cluster, "alice", ("alpha",)), "the unconfirmed claims ended",
                 max(1.0, CONFIRM_WINDOW + RECENT - (time.monotonic() - restarted)) + 10)
        figures["faults_orphans_in_the_end"] = len(orphans(cluster, "alice", ("alpha",)))
        counts = tracebacks(sorted(Path(cluster.root).glob("*.log")))
        figures["faults_tracebacks"] = sum(counts.values())
        figures["faults_tracebacks_by_log"] = counts
        progress.advance(task)
    return figures


@contextmanager
def loaded(cluster: Cluster, lost: list[str], gone: tuple[str, ...] = ()) -> Iterator[Load]:
    """The clients at work for the block; then stopped and settled, what they lost added to `lost`."""
    load = Load(cluster.url, TOKENS["alice"], POOL, clients=CLIENTS, hold=HOLD).start()
    try:
        yield load
    finally:
        load.stop()
        load.settle(gone)
        lost.extend(load.lost)


def frozen(cluster: Cluster, under: Load) -> dict[str, float]:
    """Claims started while alpha's agent is stopped."""
    start = freeze(cluster.nodes["alpha"], FROZEN)
    time.sleep(3)  # the claims started while it was stopped end
    return claims_ms(under, start, start + FROZEN)


def claims_ms(under: Load, start: float, end: float) -> dict[str, float]:
    return distribution([claim.seconds * 1000 for claim in under.between(start, end) if claim.error is None])


def dead(cluster: Cluster) -> Figures:
    """alpha killed for good: a raw call and the SDK's get_sandbox sent at once on its sandboxes, then later calls."""
    with SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
        victim = claim_on_every_node(client, POOL, NODES)
        for name, sandbox in victim.items():
            if name != "alpha":
                sandbox.delete()
        sandbox_id = victim["alpha"].id
        answers: dict[str, float] = {}

        def call(name: str, send: Callable[[], object]) -> None:
            started = time.monotonic()
            with suppress(errors.NodeUnavailable, httpx.HTTPError):
                send()
            answers[name] = time.monotonic() - started

        raw = threading.Thread(target=call, args=("raw", lambda: httpx.get(f"{cluster.url}/v1/sandboxes/{sandbox_id}",
                                                                           headers=ALICE, timeout=30)))
        sdk = threading.Thread(target=call, args=("sdk", lambda: client.get_sandbox(sandbox_id)))
        cluster.nodes["alpha"].kill()
        raw.start()
        sdk.start()
        raw.join()
        sdk.join()
        later = []
        with httpx.Client(base_url=cluster.url, headers=ALICE, timeout=30) as http:
            for _ in range(LATER_CALLS):
                started = time.monotonic()
                answer = http.get(f"/v1/sandboxes/{sandbox_id}")
                later.append((time.monotonic() - started) * 1000)
                assert answer.status_code == 503, answer.text
        status = router_health(cluster.url)["nodes"]["alpha"]["status"]
    return {"faults_dead_first_call_s": round(answers["raw"], 2), "faults_dead_sdk_get_s": round(answers["sdk"], 2),
            "faults_dead_later_calls_ms": distribution(later), "faults_dead_later_call_ms": round(max(later), 1),
            "faults_dead_later_median_ms": round(statistics.median(later), 1), "faults_dead_status": status}


def missed(figures: Figures) -> list[str]:
    return [name for name, (_, meets) in TARGETS.items() if name in figures and not meets(figures[name])]


def verdicts(figures: Figures) -> list[str]:
    lines = []
    for name, (said, meets) in TARGETS.items():
        if name in figures:
            lines.append(f"{'ok    ' if meets(figures[name]) else 'MISSED'} {name}: {figures[name]} (target: {said})")
    if "faults_frozen_claim_ms" in figures:
        lines.append(f"       claims, {CLIENTS} clients (each claims, writes, reads back, holds {HOLD} s, deletes; "
                     f"{figures['faults_claims_per_s']} claims/s with a node gone): node frozen "
                     f"{figures['faults_frozen_claim_ms']}, node gone {figures['faults_gone_claim_ms']} (ms); "
                     f"chaos {figures['faults_chaos_s']} s; router restarted in {figures['faults_router_restart_s']}"
                     f" s; a restarted node's unconfirmed claims: {figures['faults_node_restart_unconfirmed']}, "
                     f"{figures['faults_orphans_in_the_end']} left once their window passed; "
                     f"tracebacks by log {figures['faults_tracebacks_by_log']}")
    return lines
