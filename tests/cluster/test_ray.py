"""The router over a real Ray cluster on this machine: a head and three worker raylets, a node agent actor on
each, the router as `rollbox serve --ray`. Failures are real: agents SIGKILLed, the router SIGKILLed, a node
removed from the cluster and added back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from rollbox import AsyncSandboxClient, SandboxClient
from rollbox.errors import NodeLost, NodeUnavailable, NotFound
from tests.support.ray_cluster import RayTestCluster
from tests.support.servers import RL_TEMPLATE

T = TypeVar("T")

pytestmark = pytest.mark.slow
POOL = """apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {name: rl-python}
spec: {replicas: 6, sandboxTemplateRef: {name: rl-python}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayTestCluster]:
    # room for the 64 claims at once and the pool's 6 on any spread: a full cluster answers 429 at once (docs/api.md)
    cluster = RayTestCluster(tmp_path_factory.mktemp("ray"), max_sandboxes=32)
    try:
        cluster.start_router()
        cluster.wait_serving(3)
        client = SandboxClient(cluster.url)
        client.apply(RL_TEMPLATE)
        client.apply(POOL)
        cluster.wait_for(lambda h: h["pools"].get("rl-python", {}).get("ready") == 6, what="the warm pool")
        yield cluster
    finally:
        assert cluster.close() == []


def by_node(ids: list[str]) -> Counter[str]:
    return Counter(sandbox_id.rpartition("-")[0] for sandbox_id in ids)


def test_every_ray_node_runs_an_agent_with_its_own_engine(cluster: RayTestCluster) -> None:
    health = cluster.health()
    assert sorted(health["nodes"]) == ["w0", "w1", "w2"]
    pids = {cluster.agent_pid(name) for name in health["nodes"]}
    engine_ids = set()
    for data_dir in cluster.data_dirs.values():
        with sqlite3.connect(data_dir / "state.db") as db:
            engine_ids.add(db.execute("SELECT value FROM meta WHERE key='engine_id'").fetchone()[0])
    assert len(pids) == 3 and len(engine_ids) == 3
    assert os.getpid() not in pids


def test_pool_is_split_and_calls_reach_each_sandboxs_node(cluster: RayTestCluster) -> None:
    health = cluster.health()
    assert [health["nodes"][name]["sandboxes"] for name in ("w0", "w1", "w2")] == [2, 2, 2]
    client = SandboxClient(cluster.url)
    sandboxes = [client.create_sandbox(warmpool="rl-python") for _ in range(3)]
    try:
        assert by_node([s.id for s in sandboxes]) == {"w0": 1, "w1": 1, "w2": 1}
        for sandbox in sandboxes:
            sandbox.files.write("who", sandbox.id)
            assert sandbox.commands.run("cat who").stdout == sandbox.id
        lines: list[str] = []
        result = sandboxes[0].commands.run("for i in 1 2 3; do echo $i; sleep 0.05; done", on_stdout=lines.append)
        assert result.exit_code == 0 and "".join(lines) == "1\n2\n3\n" and len(lines) >= 2
        children = sandboxes[1].fork(2)
        node = sandboxes[1].id.rpartition("-")[0]
        assert {child.id.rpartition("-")[0] for child in children} == {node}
        assert all(child.files.read("who").decode() == sandboxes[1].id for child in children)
        for child in children:
            child.delete()
    finally:
        for sandbox in sandboxes:
            sandbox.delete()


def test_64_clients_claim_over_every_node_none_lost_or_doubled(cluster: RayTestCluster) -> None:
    async def run() -> list[str]:
        client = AsyncSandboxClient(cluster.url)
        got: list[str] = []

        async def one_client() -> None:
            for _ in range(3):
                sandbox = await client.create_sandbox(warmpool="rl-python")
                got.append(sandbox.id)
                await sandbox.delete()

        await asyncio.gather(*(one_client() for _ in range(64)))
        await client.close()
        return got

    ids = asyncio.run(run())
    assert len(ids) == 192 and len(set(ids)) == 192
    assert set(by_node(ids)) == {"w0", "w1", "w2"}
    cluster.wait_for(lambda h: h["claims"] == 0, what="the deletes")


def test_agent_killed_is_restarted_by_ray_and_adopts_its_sandboxes(cluster: RayTestCluster) -> None:
    client = SandboxClient(cluster.url)
    sandboxes = [client.create_sandbox(warmpool="rl-python") for _ in range(3)]
    try:
        victim = sandboxes[0]
        name = victim.id.rpartition("-")[0]
        victim.files.write("state", "kept")
        before = cluster.agent_pid(name)
        os.kill(before, signal.SIGKILL)
        killed = time.monotonic()
        while Path(f"/proc/{before}").exists():  # a call that meets the agent while it dies answers 503 instead
            time.sleep(0.01)
        for other in sandboxes[1:]:
            if not other.id.startswith(f"{name}-"):
                assert other.commands.run("true").exit_code == 0  # untouched
        # until Ray's restart is done the node is down (RESTART_WAIT): its calls answer at once, not sent again
        read = wait_for_answer(lambda: victim.commands.run("cat state").stdout, 10)
        assert read == "kept"
        assert time.monotonic() - killed < 10
        assert cluster.agent_pid(name) != before
        assert victim.refresh().info.state == "running"
    finally:
        for sandbox in sandboxes:
            sandbox.delete()


def wait_for_answer(call: Callable[[], T], timeout: float) -> T:
    """What `call` answers once its node serves again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except NodeUnavailable:
            assert time.monotonic() < deadline, "the node did not serve again"
            time.sleep(0.2)


def test_router_killed_and_restarted_serves_every_live_claim(cluster: RayTestCluster) -> None:
    client = SandboxClient(cluster.url)
    sandboxes = [client.create_sandbox(warmpool="rl-python") for _ in range(4)]
    try:
        cluster.kill_router()
        cluster.start_router()
        client = SandboxClient(cluster.url)
        assert {s.id for s in client.list_sandboxes()} == {s.id for s in sandboxes}
        for sandbox in sandboxes:
            assert client.get_sandbox(sandbox.id).commands.run("echo ok").stdout == "ok\n"
    finally:
        for sandbox in sandboxes:
            SandboxClient(cluster.url).delete_sandbox(sandbox.id)


def test_removed_node_fails_its_claims_fast_and_cleans_them_when_back(cluster: RayTestCluster) -> None:
    client = SandboxClient(cluster.url)
    sandboxes = [client.create_sandbox(warmpool="rl-python") for _ in range(3)]
    lost = next(s for s in sandboxes if s.id.startswith("w2-"))
    kept = [s for s in sandboxes if s is not lost]
    lost_container = claimed_container(cluster.data_dirs["w2"], lost.id)
    cluster.remove_node("w2")
    removed = time.monotonic()
    while True:
        try:
            lost.commands.run("true", timeout=5)
        except NodeLost as error:
            assert "left the cluster" in str(error)
            break
        except NodeUnavailable:
            pass  # its agent died before Ray declared the node dead: 503 meanwhile
        assert time.monotonic() - removed < 10, "the removed node's claims kept answering"
        time.sleep(0.05)
    for sandbox in kept:
        assert sandbox.commands.run("true").exit_code == 0
    # the pool's six replicas are back on the two nodes left
    health = cluster.wait_for(lambda h: h["pools"]["rl-python"]["ready"] == 6 and h["nodes"]["w2"]["status"] == "lost",
                              what="the pool's refill")
    assert health["nodes"]["w0"]["sandboxes"] + health["nodes"]["w1"]["sandboxes"] == 6 + len(kept)

    cluster.add_node("w2")  # back on its data directory, as a new Ray node
    cluster.wait_serving(3)
    with pytest.raises(NotFound):
        lost.refresh()
    cluster.wait_for(lambda h: lost_container not in containers(cluster.data_dirs["w2"]),
                     what="the deletion of the lost claim's container")
    assert cluster.health()["nodes"]["w2"]["claims"] == 0
    for sandbox in kept:
        sandbox.delete()


def claimed_container(data_dir: Path, sandbox_id: str) -> str:
    with contextlib.closing(sqlite3.connect(data_dir / "node.db")) as db:
        (record,) = db.execute("SELECT record FROM claims WHERE sandbox_id=?", (sandbox_id,)).fetchone()
    return json.loads(record)["container_id"]


def containers(data_dir: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(data_dir / "state.db")) as db:
        return {row[0] for row in db.execute("SELECT id FROM sandboxes")}
