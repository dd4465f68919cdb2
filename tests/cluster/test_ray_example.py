"""examples/ray end to end: its demo, run as a user runs it, against a real Ray cluster on this machine (a head and
three worker raylets, a node agent actor on each, the router as `rollbox serve --ray` with a tenant token)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollbox import SandboxClient
from tests.support.ray_cluster import RayTestCluster
from tests.support.servers import EXAMPLES, RL_TEMPLATE

pytestmark = pytest.mark.slow
DEMO = EXAMPLES / "ray" / "demo.py"
TENANT, TOKEN = "trainer", "trainer-token"
EXECUTORS = 4
FIBONACCI_90 = "2880067194370816120"
AGGREGATION = {"books": {"orders": 100, "cents": 54450}, "games": {"orders": 100, "cents": 47150},
               "tools": {"orders": 100, "cents": 50850}}
"""examples/ray/sandbox_executor.py's 300 orders, totalled by category."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayTestCluster]:
    root = tmp_path_factory.mktemp("ray-example")
    tokens = root / "tokens"
    tokens.write_text(f"{TENANT}={TOKEN}\n")
    cluster = RayTestCluster(root)
    try:
        cluster.start_router(0, "--tokens-file", str(tokens), "--admin", TENANT)
        cluster.wait_serving(3)
        with SandboxClient(cluster.url, TOKEN) as client:
            client.apply(RL_TEMPLATE)  # the template and its warm pool of 8
        cluster.wait_for(lambda h: h["pools"]["rl-python"]["ready"] == 8, what="the warm pool")
        yield cluster
    finally:
        assert cluster.close() == []


def claims_counted(url: str) -> int:
    """The claims a router or a node agent has answered since it started (its /metrics)."""
    return int(float(re.search(r"^rollbox_claims_total (\S+)$", httpx.get(f"{url}/metrics").text, re.M)[1]))


def test_demo_runs_each_task_contains_every_probe_and_claims_through_the_router(
        cluster: RayTestCluster, tmp_path: Path) -> None:
    agents = {name: node["url"] for name, node in cluster.health()["nodes"].items()}
    before = {url: claims_counted(url) for url in (cluster.url, *agents.values())}
    report_file = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(DEMO), "--address", cluster.address, "--url", cluster.url,
                           "--token", TOKEN, "--executors", str(EXECUTORS), "--report", str(report_file)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ALL CONTAINED" in done.stdout
    report = json.loads(report_file.read_text())
    executors = report["executors"]
    assert len(executors) == EXECUTORS

    # the tasks' answers
    assert [e["task"] for e in executors] == ["fibonacci", "json-aggregation"] * (EXECUTORS // 2)
    for e in executors:
        assert e["exit_code"] == 0
        if e["task"] == "fibonacci":
            assert e["output"] == FIBONACCI_90
        else:
            assert json.loads(e["output"]) == AGGREGATION

    # every claim through the router: each executor held the router's address only, and what the nodes served
    # is what the router counted
    assert {e["through"] for e in executors} == {cluster.url}
    assert len({e["sandbox"] for e in executors}) == EXECUTORS
    assert {e["sandbox"].rpartition("-")[0] for e in executors} <= set(agents)
    after = {url: claims_counted(url) for url in before}
    assert after[cluster.url] - before[cluster.url] == EXECUTORS
    assert sum(after[url] - before[url] for url in agents.values()) == EXECUTORS

    # the probes aimed at the cluster's real, live addresses
    targets = report["targets"]
    assert sorted(f"http://{host}:{port}" for host, port in targets["node_agents"]) == sorted(agents.values())
    assert f"{targets['gcs'][0]}:{targets['gcs'][1]}" == cluster.address
    assert all(targets["live_from_driver"].values())

    # every containment probe refused or timed out; the control (a sandbox's own server) connected
    for index, e in enumerate(executors):
        probes = e["probes"]
        assert probes["control: its own server"]["connected"] == [f"127.0.0.1:{7000 + index}"]
        assert probes["other sandboxes' servers"]["tried"] >= EXECUTORS - 1
        assert probes["loopback ports 1-1024"]["tried"] == 1024
        assert probes["node agents"]["tried"] == 3 and probes["Ray head (GCS)"]["tried"] == 1
        for group, outcome in probes.items():
            if group != "control: its own server":
                assert outcome["connected"] == [], (e["sandbox"], group, outcome)
                assert sum(outcome["refused"].values()) + outcome["timed_out"] == outcome["tried"]
        for name, shell in e["reverse_shells"].items():
            assert shell["outcome"] in ("refused", "timed_out"), (e["sandbox"], name, shell)
    assert report["connect_back_peers"] == []
    cluster.wait_for(lambda h: h["claims"] == 0, what="the executors' sandboxes deleted")
