"""The SDK through a router (`rollbox serve --node URL ...`) in front of two node agents: every call the
single-machine server answers, answered across the nodes; warm pools split over them by room; tenants apart."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rollbox import errors
from rollbox.client import Sandbox, SandboxClient
from rollbox.models import ExecResult
from rollbox.node.capacity import ROOM_WAIT
from tests.cluster.conftest import NODES, POOL, SHARES
from tests.support.cluster import TOKENS, Cluster, claim_on_every_node, node_of, router_health, wait_for
from tests.support.servers import RL_TEMPLATE


def pool_document(name: str, replicas: int, template: str) -> dict[str, Any]:
    return {"kind": "SandboxWarmPool", "metadata": {"name": name},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}}}


def post_apply(cluster: Cluster, tenant: str, document: dict[str, Any]) -> httpx.Response:
    """`POST /v1/apply` as the tenant's own HTTP client sends it."""
    return httpx.post(f"{cluster.url}/v1/apply", json={"documents": [document]},
                      headers={"Authorization": f"Bearer {TOKENS[tenant]}"}, timeout=30)


def node_health(cluster: Cluster, name: str) -> dict[str, Any]:
    return httpx.get(f"{cluster.nodes[name].url}/healthz", timeout=10).json()


def until_router_sees(cluster: Cluster, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The router's /healthz once `check(health)` holds (its view of the nodes is a tick behind them)."""
    def seen() -> dict[str, Any] | None:
        health = router_health(cluster.url)
        return health if check(health) else None

    return wait_for(seen, what)


@pytest.fixture(scope="module")
def sandboxes(client: SandboxClient) -> Iterator[dict[str, Sandbox]]:
    """One of alice's sandboxes on each node, claimed from the warm pool."""
    held = claim_on_every_node(client, POOL, NODES)
    yield held
    for sandbox in held.values():
        sandbox.delete()


def test_a_warm_pool_is_split_over_the_nodes_by_room(cluster: Cluster, client: SandboxClient) -> None:
    """8 replicas over nodes of 16 and 8: 5 and 3 (16/3 and 8/3, the remainder to beta's larger fraction)."""
    health = until_router_sees(cluster, lambda health: health["pools"].get(POOL, {}).get("ready") == 8 and all(
        health["nodes"][name]["sandboxes"] == share for name, share in SHARES.items()), "the pool's shares ready")
    assert health["pools"][POOL] == {"template": "rl-python", "replicas": 8, "ready": 8, "starting": 0}
    assert {name: (node["status"], node["max_sandboxes"]) for name, node in health["nodes"].items()} == {
        name: ("up", most) for name, most in NODES.items()}
    assert (health["sandboxes"], health["max_sandboxes"], health["claims"]) == (8, 24, 0)
    for name, share in SHARES.items():
        held = node_health(cluster, name)["pools"][POOL]
        assert (held["replicas"], held["ready"]) == (share, share), name
        assert held["labels"]["rollbox.io/cluster-replicas"] == "8"
    (pool,) = client.list_warmpools()
    assert (pool.name, pool.template, pool.replicas, pool.target, pool.ready, pool.labels) == (
        POOL, "rl-python", 8, 8, 8, {})
    assert client.get_warmpool(POOL) == pool
    assert [event.status for event in client.apply(str(RL_TEMPLATE)) if event.event == "applied"] == [
        "unchanged", "unchanged"]


def test_a_pool_larger_than_the_cluster_takes_the_room_left_and_no_more(cluster: Cluster,
                                                                        client: SandboxClient) -> None:
    """Placed partially: each node keeps what room the pools before it (by name) left, and the pool's replicas stay
    as asked. A claim that needs a new sandbox then takes a warm one's room: no node runs more than it may."""
    (applied,) = client.apply(yaml.safe_dump(pool_document("zz-overflow", 100, "rl-python")))
    try:
        assert applied.status == "created"
        room = {name: most - SHARES[name] for name, most in NODES.items()}
        overflow = client.get_warmpool("zz-overflow")
        assert (overflow.replicas, overflow.target) == (100, sum(room.values()))
        for name, share in room.items():
            assert node_health(cluster, name)["pools"]["zz-overflow"]["replicas"] == share
        until_router_sees(cluster, lambda health: all(health["nodes"][name]["sandboxes"] == most
                                                      for name, most in NODES.items())
                          and health["pools"]["zz-overflow"]["ready"] == sum(room.values()), "every node full")
        with client.create_sandbox(template="rl-python") as cold, client.create_sandbox(warmpool=POOL) as warm:
            assert cold.run("true").exit_code == 0 and warm.run("true").exit_code == 0
            for name, most in NODES.items():
                assert node_health(cluster, name)["sandboxes"] <= most
    finally:
        client.delete_warmpool("zz-overflow")
    with pytest.raises(errors.NotFound):
        client.get_warmpool("zz-overflow")
    until_router_sees(cluster, lambda health: "zz-overflow" not in health["pools"] and all(
        health["nodes"][name]["sandboxes"] == share for name, share in SHARES.items())
        and health["pools"][POOL]["ready"] == 8, "the cluster back to the first pool alone")


def test_a_pool_whose_template_is_missing_is_refused(cluster: Cluster, client: SandboxClient) -> None:
    document = pool_document("orphan", 2, "no-such-template")
    with pytest.raises(errors.TemplateNotFound, match="no-such-template"):
        client.apply(yaml.safe_dump(document))
    answer = post_apply(cluster, "alice", document)
    events = [json.loads(line) for line in answer.text.splitlines()]
    assert [event.get("code") for event in events if event["event"] == "error"] == ["template_not_found"], events
    assert errors.TemplateNotFound.status == 404
    assert "orphan" not in router_health(cluster.url)["pools"]
    for name in NODES:
        assert "orphan" not in node_health(cluster, name)["pools"]


def test_claims_spread_over_the_nodes_and_list_is_their_union(cluster: Cluster, client: SandboxClient) -> None:
    claimed = [client.create_sandbox(warmpool=POOL) for _ in range(6)]
    try:
        assert {node_of(sandbox.id) for sandbox in claimed} == set(NODES)
        for sandbox in claimed:
            name, _, suffix = sandbox.id.rpartition("-")
            assert len(suffix) == 16 and int(suffix, 16) >= 0, sandbox.id
            assert (sandbox.info.warmpool, sandbox.info.template, sandbox.info.tenant) == (POOL, "rl-python", "alice")
        listed = {sandbox.id for sandbox in client.list_sandboxes()}
        assert {sandbox.id for sandbox in claimed} <= listed
        for name in NODES:
            on_node = {sandbox.id for sandbox in claimed if node_of(sandbox.id) == name}
            assert node_health(cluster, name)["claims"] >= len(on_node)
        until_router_sees(cluster, lambda health: health["claims"] >= 6, "the claims counted")
    finally:
        for sandbox in claimed:
            sandbox.delete()
    for sandbox in claimed:
        with pytest.raises(errors.SandboxNotFound):
            client.get_sandbox(sandbox.id)
    assert not {sandbox.id for sandbox in claimed} & {sandbox.id for sandbox in client.list_sandboxes()}


def test_a_claim_no_node_has_room_for_is_answered_429_at_once_and_makes_nothing(cluster: Cluster,
                                                                                client: SandboxClient) -> None:
    """Claims take the warm sandboxes' room until every node holds only claimed ones. The next claim is refused by
    each node in turn, and the router answers 429 `capacity_exceeded` without the node's room wait (no deletion is
    under way). A deletion makes room for a claim again."""
    def claim_when_room() -> Sandbox | None:
        try:
            return client.create_sandbox(warmpool=POOL)
        except errors.CapacityExceeded:
            return None  # a refill of the pool still starting holds a node's last place a moment

    before = {sandbox.id for sandbox in client.list_sandboxes()}
    claimed: list[Sandbox] = []
    try:
        while len(before) + len(claimed) < sum(NODES.values()):
            claimed.append(wait_for(claim_when_room, "a place for a claim"))
        assert {name: node_health(cluster, name)["sandboxes"] for name in NODES} == NODES
        started = time.monotonic()
        with pytest.raises(errors.CapacityExceeded, match=r"no node of the cluster has room.*at its maximum"):
            client.create_sandbox(warmpool=POOL)
        assert time.monotonic() - started < ROOM_WAIT
        assert {sandbox.id for sandbox in client.list_sandboxes()} == before | {sandbox.id for sandbox in claimed}
        claimed.pop().delete()
        claimed.append(wait_for(claim_when_room, "the place a deletion made"))
        assert claimed[-1].run("true").exit_code == 0
    finally:
        for sandbox in claimed:
            sandbox.delete()
    until_router_sees(cluster, lambda health: health["pools"][POOL]["ready"] == 8, "the warm pool refilled")


def test_commands_run_plain_and_streamed_line_by_line(sandboxes: dict[str, Sandbox]) -> None:
    for name, sandbox in sandboxes.items():
        result = sandbox.run("echo $PYTHONHASHSEED; pwd; echo oops >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "0\n/work\n", "oops\n",
                                                                                       False), name
        streamed, arrived, stderr = stream(sandbox, "for i in 1 2 3; do echo line$i; echo err$i >&2; sleep 0.4; done")
        ended = time.monotonic()
        assert streamed.stdout == "line1\nline2\nline3\n" == "".join(data for _, data in arrived), name
        assert stderr == "err1\nerr2\nerr3\n" == streamed.stderr
        assert len(arrived) >= 3 and arrived[0][1].startswith("line1"), arrived
        spread = arrived[-1][0] - arrived[0][0]
        assert spread > 0.6 and ended - arrived[0][0] > 0.6, f"the lines came {spread:.2f} s apart, not 0.8"
        timed = sandbox.run("sleep 10", timeout=0.5)
        assert timed.timed_out and timed.exit_code != 0


def stream(sandbox: Sandbox, command: str) -> tuple[ExecResult, list[tuple[float, str]], str]:
    """The result, each piece of stdout with the time it arrived, and stderr as it arrived."""
    arrived: list[tuple[float, str]] = []
    stderr: list[str] = []
    result = sandbox.commands.run(command, on_stdout=lambda data: arrived.append((time.monotonic(), data)),
                                  on_stderr=stderr.append)
    return result, arrived, "".join(stderr)


def test_background_processes_terminals_and_shells_through_the_router(sandboxes: dict[str, Sandbox]) -> None:
    for name, sandbox in sandboxes.items():
        counter = sandbox.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", background=True, tag="count")
        assert [info.id for info in sandbox.commands.list()] == [counter.id], name
        arrived: list[str] = []
        assert counter.wait(on_stdout=arrived.append).stdout == "1\n2\n3\n" == "".join(arrived), name
        assert sandbox.commands.connect(counter.id).wait().exit_code == 0  # read back from the start
        reader = sandbox.commands.run(["cat"], background=True, pty=(24, 80))
        reader.send_stdin("typed\n")
        echoed = ""
        for event in reader.events():
            echoed += event.data or ""
            if "typed" in echoed:
                break
        reader.kill()
        assert "typed" in echoed, name
        with sandbox.shell() as shell:
            shell.run("cd /tmp && export KEPT=yes")
            assert shell.run("pwd; echo $KEPT").stdout == "/tmp\nyes\n", name
            assert shell.run("sleep 30", timeout=0.3).timed_out and shell.run("echo on").stdout == "on\n"
        counter.delete()
        assert counter.id not in {info.id for info in sandbox.commands.list()}, name


def test_files_through_the_router(sandboxes: dict[str, Sandbox], tmp_path: Path) -> None:
    for name, sandbox in sandboxes.items():
        files = sandbox.files
        files.write("notes/a.txt", f"on {name}\n", mode=0o640)
        assert files.read_text("notes/a.txt") == f"on {name}\n"
        assert sandbox.run("cat /work/notes/a.txt").stdout == f"on {name}\n"
        info = files.stat("notes/a.txt")
        assert (info.type, info.size, info.mode & 0o777) == ("file", len(f"on {name}\n"), 0o640)
        files.mkdir("notes/sub")
        assert {entry.name: entry.type for entry in files.list("notes")} == {"a.txt": "file", "sub": "dir"}
        assert files.exists("notes/sub") and not files.exists("notes/none")
        files.remove("notes/a.txt")
        assert not files.exists("notes/a.txt")
        with pytest.raises(errors.FileNotFound):
            files.read("notes/a.txt")
        source = tmp_path / name / "up"
        (source / "pkg").mkdir(parents=True)
        (source / "pkg" / "data.bin").write_bytes(bytes(range(256)) * 64)
        (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
        (source / "run.sh").chmod(0o755)
        assert files.upload_dir(source, "project") == 3
        assert sandbox.run("cd project && ./run.sh").stdout == "ran\n"
        sandbox.run("echo new > project/pkg/new.txt")
        copy = tmp_path / name / "down"
        files.download_dir("project", copy)
        assert (copy / "pkg" / "data.bin").read_bytes() == (source / "pkg" / "data.bin").read_bytes()
        assert (copy / "pkg" / "new.txt").read_text() == "new\n"
        assert (copy / "run.sh").stat().st_mode & 0o777 == 0o755
        files.remove("notes", recursive=True)
        files.remove("project", recursive=True)
        assert not files.exists("notes")


def test_reset_keeps_the_id_and_the_node(sandboxes: dict[str, Sandbox]) -> None:
    for name, sandbox in sandboxes.items():
        sandbox.files.write("scratch.txt", "dirty\n")
        before = sandbox.id
        sandbox.reset()
        assert sandbox.id == before and node_of(sandbox.id) == name
        assert not sandbox.files.exists("scratch.txt")
        assert sandbox.run("echo alive").stdout == "alive\n"


def test_fork_puts_the_children_on_the_parents_node(sandboxes: dict[str, Sandbox]) -> None:
    for name, sandbox in sandboxes.items():
        sandbox.files.write("state.txt", f"state of {name}\n")
        children = sandbox.fork(2)
        try:
            assert [node_of(child.id) for child in children] == [name, name]
            assert len({child.id for child in children} | {sandbox.id}) == 3
            for child in children:
                assert child.info.parent == sandbox.id
                assert child.files.read_text("state.txt") == f"state of {name}\n"
            children[0].files.write("state.txt", "changed\n")
            assert sandbox.files.read_text("state.txt") == f"state of {name}\n"
        finally:
            for child in children:
                child.delete()
        sandbox.files.remove("state.txt")


def test_a_claim_from_a_snapshot_lands_on_the_node_holding_it(client: SandboxClient,
                                                              sandboxes: dict[str, Sandbox]) -> None:
    """Each node holds one snapshot: the least loaded node can serve at most one of the claims by chance."""
    for name, sandbox in sandboxes.items():
        sandbox.files.write("snapped.txt", f"from {name}\n")
        snapshot = sandbox.snapshot(f"snap-{name}")
        assert (snapshot.name, snapshot.template) == (f"snap-{name}", "rl-python")
        sandbox.files.remove("snapped.txt")
    try:
        assert {f"snap-{name}" for name in NODES} <= {snapshot.name for snapshot in client.list_snapshots()}
        for name in NODES:
            with client.create_sandbox(snapshot=f"snap-{name}") as restored:
                assert node_of(restored.id) == name
                assert restored.files.read_text("snapped.txt") == f"from {name}\n"
        with pytest.raises(errors.SnapshotNotFound):
            client.create_sandbox(snapshot="snap-nowhere")
    finally:
        for name in NODES:
            client.delete_snapshot(f"snap-{name}")
    assert not {f"snap-{name}" for name in NODES} & {snapshot.name for snapshot in client.list_snapshots()}
    with pytest.raises(errors.SnapshotNotFound):
        client.delete_snapshot(f"snap-{next(iter(NODES))}")


def test_pause_resume_and_stats(sandboxes: dict[str, Sandbox]) -> None:
    for name, sandbox in sandboxes.items():
        assert sandbox.pause().info.state == "paused", name
        assert sandbox.refresh().info.state == "paused"
        assert sandbox.resume().info.state == "running"
        assert sandbox.run("echo after").stdout == "after\n"
        stats = sandbox.stats()
        assert stats.memory_bytes > 0 and stats.pids >= 1 and stats.cpu_seconds >= 0


def test_tenants_cannot_reach_each_others_sandboxes(cluster: Cluster, client: SandboxClient, bob: SandboxClient,
                                                   sandboxes: dict[str, Sandbox]) -> None:
    as_bob = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {TOKENS['bob']}"}, timeout=30)
    with as_bob, bob.create_sandbox(warmpool=POOL) as bobs:
        assert bobs.info.tenant == "bob"
        for name, sandbox in sandboxes.items():
            path = f"/v1/sandboxes/{sandbox.id}"
            for method, tail, body in [("GET", "", None), ("POST", "/exec", {"command": "echo pwned"}),
                                       ("GET", "/files?path=.", None), ("POST", "/fork", {"count": 1}),
                                       ("POST", "/reset", None), ("GET", "/processes", None),
                                       ("POST", "/processes", {"command": "echo pwned"}),
                                       ("POST", "/shells", {}), ("DELETE", "", None)]:
                answer = as_bob.request(method, path + tail, json=body)
                assert answer.status_code == 404, (name, method, tail, answer.text)
                assert answer.json()["error"]["code"] == "sandbox_not_found"
            with pytest.raises(errors.SandboxNotFound):
                bob.get_sandbox(sandbox.id)
            assert sandbox.run("echo still mine").stdout == "still mine\n"
        assert [sandbox.id for sandbox in bob.list_sandboxes()] == [bobs.id]
        assert bobs.id not in {sandbox.id for sandbox in client.list_sandboxes()}
        with pytest.raises(errors.SandboxNotFound):
            client.get_sandbox(bobs.id)
        assert httpx.get(f"{cluster.url}/v1/sandboxes", timeout=10).status_code == 401
        assert httpx.get(f"{cluster.url}/v1/sandboxes", headers={"Authorization": "Bearer nobody"},
                         timeout=10).status_code == 401


def test_only_an_admin_changes_templates_and_pools(cluster: Cluster, bob: SandboxClient) -> None:
    document = pool_document("bobs-pool", 1, "rl-python")
    with pytest.raises(errors.Forbidden, match="admin"):
        bob.apply(yaml.safe_dump(document))
    answer = post_apply(cluster, "bob", document)
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
    with pytest.raises(errors.Forbidden):
        bob.delete_warmpool(POOL)
    with pytest.raises(errors.Forbidden):
        bob.delete_template("rl-python")
    assert bob.get_warmpool(POOL).replicas == 8
    assert "bobs-pool" not in router_health(cluster.url)["pools"]
