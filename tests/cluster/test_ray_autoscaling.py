"""Ray's autoscaler, asked by the router for nodes: on Ray's fake multi-node autoscaling cluster, whose autoscaler
starts and stops real raylets on this machine as if they were machines."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox import SandboxClient
from tests.support.engines import leftovers
from tests.support.ray_cluster import ROLLBOX, AutoscalingTestCluster, _free_port, down
from tests.support.servers import RL_TEMPLATE, wait_until_serving

pytestmark = pytest.mark.slow


def pool(replicas: int) -> str:
    return f"""apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {{name: rl-python}}
spec: {{replicas: {replicas}, sandboxTemplateRef: {{name: rl-python}}}}
"""


@pytest.fixture
def router(tmp_path: Path) -> Iterator[str]:
    cluster = AutoscalingTestCluster(tmp_path, max_workers=3, max_sandboxes=4, min_workers=1)
    url = f"http://127.0.0.1:{_free_port()}"
    process = None
    try:
        with (tmp_path / "router.log").open("ab") as log:
            process = subprocess.Popen(
                [ROLLBOX, "serve", "--ray", cluster.address, "--port", url.rsplit(":", 1)[1], "--secret-file",
                 str(cluster.secret_file), "--node-data-dir", str(tmp_path / "nodes" / "{node}"),
                 "--max-sandboxes", "4", "--release-idle-nodes"], stdout=log, stderr=log)
        wait_until_serving(url, process, "the router")
        yield url
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
        cluster.close()
        left = []
        for data_dir in (tmp_path / "nodes").glob("*"):
            down(data_dir)
            left += leftovers(data_dir)
        assert left == []


def settle(url: str, check: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.TransportError):
            health = httpx.get(f"{url}/healthz").json()
            if check(health):
                return health
        assert time.monotonic() < deadline, f"{what}: {health}"
        time.sleep(0.2)


def serving(health: dict[str, Any]) -> int:
    return sum(node["status"] == "up" for node in health["nodes"].values())


def test_pools_that_need_room_get_nodes_from_the_autoscaler_and_give_them_back(router: str) -> None:
    settle(router, lambda h: serving(h) == 1, 120, "the first node")
    client = SandboxClient(router)
    client.apply(RL_TEMPLATE)
    client.apply(pool(10))  # three nodes of four sandboxes each
    health = settle(router, lambda h: serving(h) == 3 and h["pools"]["rl-python"]["ready"] == 10, 180,
                    "the autoscaler's new nodes")
    assert sorted(node["sandboxes"] for node in health["nodes"].values() if node["status"] == "up") == [3, 3, 4]

    client.apply(pool(2))  # one node's worth: the request falls, and idle nodes go
    settle(router, lambda h: serving(h) == 1 and h["pools"]["rl-python"]["ready"] == 2, 180,
           "the nodes given back")
