"""The node over a real engine: warm pools, claims, reset, fork, snapshots, idle pause, TTL, quotas, restarts."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from rollbox.engine import Engine
from rollbox.errors import (
    CapacityExceeded,
    Conflict,
    InvalidResource,
    NotFound,
    NoWarmSandbox,
    RollboxError,
    SandboxNotFound,
    SandboxNotRunning,
    TemplateNotFound,
)
from rollbox.models import ClaimRequest, ExecRequest
from rollbox.node import LocalNode, deletions, pools
from rollbox.spec import SandboxTemplate, SandboxWarmPool, parse_resource
from tests.support.engines import BASIC, cgroup_value, make_engine, teardown_engine, template_for

pytestmark = pytest.mark.anyio
TEMPLATE = SandboxTemplate.model_validate(BASIC)
NODE: dict[str, Any] = {"max_sandboxes": 12, "tenant_quota": 6, "tick": 0.05}


def pool(name: str = "basic-pool", replicas: int = 2, template: str = "basic",
         max_replicas: int | None = None) -> SandboxWarmPool:
    return SandboxWarmPool.model_validate({"metadata": {"name": name}, "spec": {
        "replicas": replicas, "maxReplicas": max_replicas, "sandboxTemplateRef": {"name": template}}})


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = make_engine(tmp_path_factory.mktemp("node"))
    engine.build(TEMPLATE)
    yield engine
    teardown_engine(engine)


@pytest.fixture
async def node(engine: Engine) -> AsyncIterator[LocalNode]:
    node = LocalNode(engine, **NODE)
    yield node
    node.close()
    engine.destroy_all()
    for path in Path(engine.data_dir).glob("node.db*"):
        path.unlink()


@pytest.fixture
def restart(engine: Engine) -> Iterator[Callable[[LocalNode], LocalNode]]:
    """Closes a node and starts another over its engine, as a restarted server does; closes those it started."""
    started: list[LocalNode] = []

    def restart(node: LocalNode) -> LocalNode:
        node.close()
        started.append(LocalNode(engine, **NODE))
        return started[-1]

    yield restart
    for node in started:
        node.close()


async def until(condition, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await anyio.sleep(0.05)


async def filled(node: LocalNode, name: str = "basic-pool") -> None:
    async def full() -> bool:
        info = await node.warmpool(name)
        return info.ready == info.target
    await until(full)


async def run(node: LocalNode, tenant: str, sandbox_id: str, command: str) -> str:
    result = await node.exec(tenant, sandbox_id, ExecRequest(command=command))
    assert result.exit_code == 0, result
    return result.stdout


async def test_apply_reports_created_unchanged_configured(node: LocalNode) -> None:
    assert await node.apply(TEMPLATE, print) == "unchanged"  # built by the module fixture already
    assert await node.apply(pool(replicas=1), print) == "created"
    assert await node.apply(pool(replicas=1), print) == "unchanged"
    assert await node.apply(pool(replicas=2), print) == "configured"
    await filled(node)
    with pytest.raises(TemplateNotFound):
        await node.apply(pool("other", template="missing"), print)


async def test_claim_takes_a_ready_sandbox_from_the_pool(node: LocalNode, engine: Engine) -> None:
    await node.apply(pool(replicas=2), print)
    await filled(node)
    ready = set(node.resources.pools["basic-pool"].ready)
    started = time.perf_counter()
    claim = await node.claim("alice", ClaimRequest(warmpool="basic-pool"))
    assert time.perf_counter() - started < 0.5  # no container start: ~0.1 ms on an idle machine
    assert node.held.claims[claim.id].container_id in ready
    assert (claim.template, claim.warmpool, claim.tenant, claim.state) == ("basic", "basic-pool", "alice", "running")
    assert await run(node, "alice", claim.id, "cat /opt/data/file") == "baseline\n"
    await filled(node)  # refilled in the background


async def test_empty_pool_falls_back_to_a_cold_start(node: LocalNode) -> None:
    await node.apply(pool(replicas=0), print)
    claim = await node.claim("alice", ClaimRequest(warmpool="basic-pool", env={"GREETING": "hi"}))
    assert await run(node, "alice", claim.id, "echo $GREETING") == "hi\n"
    cold = await node.claim("alice", ClaimRequest(template="basic"))
    assert await run(node, "alice", cold.id, "cat /opt/data/file") == "baseline\n"


async def test_a_warm_only_claim_takes_a_warm_sandbox_or_nothing(node: LocalNode) -> None:
    """What a router's edge asks of each node in turn: a warm sandbox, or 404 no_warm_sandbox at once having started
    nothing, whatever else the claim asks for."""
    await node.apply(pool(replicas=1), print)
    await filled(node)
    claim = await node.claim("alice", ClaimRequest(warmpool="basic-pool"), warm_only=True)
    assert (claim.warmpool, claim.tenant) == ("basic-pool", "alice")
    await node.apply(pool(replicas=0), print)  # no refill: the pool stays empty
    for request in (ClaimRequest(warmpool="basic-pool"), ClaimRequest(template="basic"),
                    ClaimRequest(warmpool="no-such-pool"), ClaimRequest(warmpool="basic-pool", snapshot="a-snapshot")):
        started = time.perf_counter()
        with pytest.raises(NoWarmSandbox):
            await node.claim("alice", request, warm_only=True)
        assert time.perf_counter() - started < 0.5, request  # no container started
    assert [info.id for info in await node.claims("alice")] == [claim.id]


async def test_unknown_sources_fail_clearly(node: LocalNode) -> None:
    with pytest.raises(TemplateNotFound):
        await node.claim("alice", ClaimRequest(template="missing"))
    with pytest.raises(NotFound):  # NotFound: no such warm pool
        await node.claim("alice", ClaimRequest(warmpool="missing"))
    assert (await node.health())["sandboxes"] == 0


async def test_a_warm_pool_that_can_never_fill_is_refused(node: LocalNode) -> None:
    """A pool's replicas must fit the node beside the other pools' replicas: one that cannot is refused at
    apply, saying the numbers and what to change, instead of filling what it can."""
    node.capacity.max_sandboxes = 4
    with pytest.raises(InvalidResource, match=r"replicas 5 cannot fit this node, which runs at most 4 sandboxes: "
                                              r"lower replicas to 4 or fewer"):
        await node.apply(pool("first", replicas=5), print)
    assert await node.apply(pool("first", replicas=3), print) == "created"
    with pytest.raises(InvalidResource, match=r"warm pools first \(3\) keep 3 ready: lower replicas to 1 or fewer"):
        await node.apply(pool(replicas=2), print)
    assert await node.apply(pool(replicas=1), print) == "created"
    with pytest.raises(InvalidResource, match="basic-pool \\(1\\) keep 1 ready: lower replicas to 3 or fewer"):
        await node.apply(pool("first", replicas=4), print)  # its own replicas are not counted twice
    assert [(p.name, p.replicas) for p in await node.warmpools()] == [("basic-pool", 1), ("first", 3)]


async def test_full_node_fails_at_once_and_quota_is_per_tenant(node: LocalNode) -> None:
    node.capacity.max_sandboxes = 3
    claims = [await node.claim("alice", ClaimRequest(template="basic")) for _ in range(3)]
    started = time.perf_counter()
    with pytest.raises(CapacityExceeded):
        await node.claim("bob", ClaimRequest(template="basic"))
    assert time.perf_counter() - started < 1
    node.capacity.max_sandboxes = 12
    claims += [await node.claim("alice", ClaimRequest(template="basic")) for _ in range(3)]
    with pytest.raises(CapacityExceeded, match="quota"):
        await node.claim("alice", ClaimRequest(template="basic"))
    await node.claim("bob", ClaimRequest(template="basic"))
    await node.delete("alice", claims[0].id)
    await node.claim("alice", ClaimRequest(template="basic"))


async def test_a_full_node_evicts_a_warm_sandbox_for_a_cold_claim(node: LocalNode, engine: Engine) -> None:
    other = SandboxTemplate.model_validate({"metadata": {"name": "other"}})
    await node.apply(other, print)
    await node.apply(pool(replicas=2, template="other", name="other-pool"), print)
    await filled(node, "other-pool")
    node.capacity.max_sandboxes = 2
    claim = await node.claim("alice", ClaimRequest(template="basic"))
    assert await run(node, "alice", claim.id, "cat /opt/data/file") == "baseline\n"
    await node.delete_warmpool("other-pool")
    await node.delete_template("other")


async def test_tenants_do_not_see_each_other(node: LocalNode) -> None:
    claim = await node.claim("alice", ClaimRequest(template="basic"))
    for call in (node.get("bob", claim.id), node.delete("bob", claim.id), node.reset("bob", claim.id),
                 node.exec("bob", claim.id, ExecRequest(command="true")), node.files("bob", claim.id, "list", "/")):
        with pytest.raises(SandboxNotFound):
            await call
    assert await node.claims("bob") == []
    assert [c.id for c in await node.claims("alice")] == [claim.id]


async def test_reset_keeps_the_id_and_brings_the_baseline_back(node: LocalNode, engine: Engine) -> None:
    await node.apply(pool(replicas=1), print)
    await filled(node)
    claim = await node.claim("alice", ClaimRequest(warmpool="basic-pool"))
    await run(node, "alice", claim.id, "touch ~/new")
    old = node.held.claims[claim.id].container_id
    await filled(node)
    ready = set(node.resources.pools["basic-pool"].ready)
    again = await node.reset("alice", claim.id)
    assert node.held.claims[claim.id].container_id in ready  # a warm sandbox swapped in
    assert again.id == claim.id
    assert await run(node, "alice", claim.id, "cat /opt/data/file; ls ~") == "baseline\n"

    async def old_gone() -> bool:
        return old not in {info.id for info in engine.list()}
    await until(old_gone)


async def test_reset_without_room_restarts_in_place(node: LocalNode) -> None:
    node.capacity.max_sandboxes = 1
    claim = await node.claim("alice", ClaimRequest(template="basic"))
    await run(node, "alice", claim.id, "touch ~/new")
    await node.reset("alice", claim.id)
    assert await run(node, "alice", claim.id, "ls ~") == ""


async def test_fork_gives_new_claims_with_the_parents_files(node: LocalNode) -> None:
    parent = await node.claim("alice", ClaimRequest(template="basic", labels={"episode": "1"}))
    await run(node, "alice", parent.id, "echo state > ~/state")
    children = await node.fork("alice", parent.id, 2)
    assert len({c.id for c in children}) == 2
    for child in children:
        assert (child.parent, child.tenant, child.labels) == (parent.id, "alice", {"episode": "1"})
        assert await run(node, "alice", child.id, "cat ~/state") == "state\n"
    await run(node, "alice", children[0].id, "echo mine > ~/state")
    assert await run(node, "alice", children[1].id, "cat ~/state") == "state\n"
    await node.reset("alice", children[0].id)  # back to the template, like its parent would
    assert await run(node, "alice", children[0].id, "ls ~") == ""
    with pytest.raises(CapacityExceeded):
        await node.fork("alice", parent.id, 5)  # quota 6: three held


async def test_snapshots_belong_to_their_tenant(node: LocalNode) -> None:
    claim = await node.claim("alice", ClaimRequest(template="basic"))
    await run(node, "alice", claim.id, "echo saved > ~/saved")
    info = await node.snapshot("alice", claim.id, "step-1")
    assert (info.name, info.template, info.source) == ("step-1", "basic", claim.id)
    assert [s.name for s in await node.snapshots("alice")] == ["step-1"]
    assert await node.snapshots("bob") == []
    restored = await node.claim("alice", ClaimRequest(snapshot="step-1"))
    assert restored.snapshot == "step-1" and restored.template == "basic"
    await run(node, "alice", restored.id, "rm ~/saved")
    await node.reset("alice", restored.id)
    assert await run(node, "alice", restored.id, "cat ~/saved") == "saved\n"
    with pytest.raises(NotFound):
        await node.claim("bob", ClaimRequest(snapshot="step-1"))
    await node.delete_snapshot("alice", "step-1")
    assert await node.snapshots("alice") == []
    assert await run(node, "alice", restored.id, "cat ~/saved") == "saved\n"


async def test_pause_and_resume(node: LocalNode) -> None:
    claim = await node.claim("alice", ClaimRequest(template="basic"))
    assert (await node.pause("alice", claim.id)).state == "paused"
    with pytest.raises(SandboxNotRunning):
        await node.exec("alice", claim.id, ExecRequest(command="true"))
    assert (await node.resume("alice", claim.id)).state == "running"
    assert await run(node, "alice", claim.id, "echo ok") == "ok\n"


async def test_idle_sandboxes_pause_and_wake_on_the_next_call(node: LocalNode, engine: Engine) -> None:
    claim = await node.claim("alice", ClaimRequest(template="basic", idle_pause_after=0.3))
    container_id = node.held.claims[claim.id].container_id
    busy = node.exec("alice", claim.id, ExecRequest(command="sleep 0.8; echo done"))
    assert (await busy).stdout == "done\n"  # a running command keeps it awake

    async def paused() -> bool:  # the claim says so a moment before the engine has frozen it
        return (await node.get("alice", claim.id)).state == engine.info(container_id).state == "paused"
    await until(paused)
    assert await run(node, "alice", claim.id, "echo awake") == "awake\n"
    assert (await node.get("alice", claim.id)).state == "running"


async def test_claims_expire(node: LocalNode, engine: Engine) -> None:
    claim = await node.claim("alice", ClaimRequest(template="basic", shutdown_after=0.3))
    assert claim.expires_at is not None
    container_id = node.held.claims[claim.id].container_id

    async def gone() -> bool:
        return container_id not in {info.id for info in engine.list()}
    await until(gone)
    with pytest.raises(SandboxNotFound):
        await node.get("alice", claim.id)


async def test_changed_template_replaces_warm_sandboxes(node: LocalNode, engine: Engine, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("one\n")
    document = {"kind": "SandboxTemplate", "metadata": {"name": "copied"},
                "spec": {"steps": [{"copy": {"src": "hello.txt", "dest": "/opt/hello.txt"}}]}}
    assert await node.apply(parse_resource(document, str(tmp_path)), print) == "created"
    assert await node.apply(parse_resource(document, str(tmp_path)), print) == "unchanged"
    await node.apply(pool("copied-pool", replicas=1, template="copied"), print)
    await filled(node, "copied-pool")
    (tmp_path / "hello.txt").write_text("two\n")
    assert await node.apply(parse_resource(document, str(tmp_path)), print) == "configured"
    await filled(node, "copied-pool")
    claim = await node.claim("alice", ClaimRequest(warmpool="copied-pool"))
    assert await run(node, "alice", claim.id, "cat /opt/hello.txt") == "two\n"
    with pytest.raises(Conflict):
        await node.delete_template("copied")
    await node.delete_warmpool("copied-pool")
    await node.delete_template("copied")


async def test_a_pool_deleted_while_refilling_lets_its_template_go(node: LocalNode, engine: Engine,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A pool deleted halfway through filling (some sandboxes ready, more starting) stops refilling
    before it is emptied: no start then fails on the deleted template, none leaves a sandbox behind,
    and none lands in the deleted pool after it was emptied."""
    await node.apply(SandboxTemplate.model_validate({**BASIC, "metadata": {"name": "doomed"}}), print)

    async def halfway() -> bool:
        filling = node.resources.pools["doomed-pool"]
        return filling.starting > 0 and len(filling.ready) > 0

    async def nothing_left() -> bool:
        return not engine.list()

    for _ in range(15):
        await node.apply(pool("doomed-pool", replicas=6, template="doomed"), print)
        await until(halfway)
        doomed = node.resources.pools["doomed-pool"]
        await node.delete_warmpool("doomed-pool")
        assert doomed.starting == 0
        await until(nothing_left)
    await node.delete_template("doomed")
    assert not [record for record in caplog.records if record.levelname == "ERROR"]


async def test_a_pool_with_max_replicas_grows_to_its_bursts_then_shrinks_back(
        node: LocalNode, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """An RL step claims its episodes at once: after a burst larger than `replicas`, the pool keeps as
    many ready (up to `maxReplicas`) so the next step's claims are warm, then shrinks when bursts stop."""
    monkeypatch.setattr(pools, "BURST_MEMORY", 2.0)
    await node.apply(pool("elastic", replicas=1, max_replicas=3), print)
    await filled(node, "elastic")
    claims = [await node.claim("alice", ClaimRequest(warmpool="elastic")) for _ in range(4)]
    assert (await node.warmpool("elastic")).target == 3  # a burst of 4, capped at maxReplicas

    async def ready(count: int) -> bool:
        info = await node.warmpool("elastic")
        return info.ready == count and info.target == count and not info.starting

    await until(lambda: ready(3))
    warm = set(node.resources.pools["elastic"].ready)
    before = time.monotonic()
    second = [await node.claim("alice", ClaimRequest(warmpool="elastic")) for _ in range(2)]
    assert {node.held.claims[claim.id].container_id for claim in second} <= warm  # the next step's claims are warm
    await until(lambda: ready(3))
    await until(lambda: ready(1))
    assert time.monotonic() - before >= pools.BURST_MEMORY  # it kept its size while the burst was recent
    await until(lambda: anyio.to_thread.run_sync(lambda: len(engine.list()) == len(claims) + len(second) + 1))
    for claim in claims + second:
        await node.delete("alice", claim.id)
    await node.delete_warmpool("elastic")


async def test_a_restarted_node_keeps_claims_and_pools(node: LocalNode,
                                                       restart: Callable[[LocalNode], LocalNode]) -> None:
    await node.apply(pool(replicas=2), print)
    await filled(node)
    kept = await node.claim("alice", ClaimRequest(warmpool="basic-pool", idle_pause_after=0.2))
    await run(node, "alice", kept.id, "echo mine > ~/mine")

    async def paused() -> bool:
        return (await node.get("alice", kept.id)).state == "paused"

    await until(paused)
    ready = set(node.resources.pools["basic-pool"].ready)
    again = restart(node)
    assert set(again.resources.pools["basic-pool"].ready) == ready
    assert await run(again, "alice", kept.id, "cat ~/mine") == "mine\n"
    assert [c.id for c in await again.claims("alice")] == [kept.id]


@pytest.mark.parametrize(("runtime", "restarted"), [("runc", False), ("runc", True), ("runsc", False)],
                         ids=["runc", "runc-recovered", "runsc"])
async def test_a_warm_sandbox_that_dies_is_never_handed_out(node: LocalNode, engine: Engine, runtime: str,
                                                            restarted: bool,
                                                            restart: Callable[[LocalNode], LocalNode]) -> None:
    """Killed on the host while it waits (as the OOM killer would kill it), a warm sandbox leaves its
    pool and another takes its place: no claim gets a dead sandbox, and no descriptor is left behind."""
    template = template_for(runtime)
    if runtime != "runc":
        await node.apply(SandboxTemplate.model_validate({**BASIC, "metadata": {"name": template},
                                                         "spec": {**BASIC["spec"], "runtime": runtime}}), print)
    await node.apply(pool(replicas=2, template=template), print)
    await filled(node)
    if restarted:
        node = restart(node)
    doomed = set(node.resources.pools["basic-pool"].ready)
    for container_id in doomed:
        for pid in cgroup_value(engine, engine.get(container_id), "pids", "cgroup.procs").split():
            os.kill(int(pid), signal.SIGKILL)
    with pytest.raises(SandboxNotRunning):
        engine.exec(next(iter(doomed)), ["true"])

    async def replaced() -> bool:
        return not doomed & set(node.resources.pools["basic-pool"].ready)
    await until(replaced)
    claims = [await node.claim("alice", ClaimRequest(warmpool="basic-pool")) for _ in range(2)]
    assert not doomed & {node.held.claims[claim.id].container_id for claim in claims}
    for claim in claims:
        assert await run(node, "alice", claim.id, "echo alive") == "alive\n"
        await node.delete("alice", claim.id)

    async def only_warm_ones_watched() -> bool:
        ready = set(node.resources.pools["basic-pool"].ready)
        return len(ready) == 2 and node.resources.exits.watching() == ready
    await until(only_warm_ones_watched)


async def test_a_claimed_sandbox_whose_container_stopped_shows_stopped_until_reset(node: LocalNode,
                                                                                  engine: Engine) -> None:
    """Killed on the host (as the OOM killer would kill it), a claimed sandbox says so in `get` and `list`,
    its calls fail as not running, and a reset brings it back under the same claim."""
    claim = await node.claim("alice", ClaimRequest(template="basic"))  # cold: no pool watched its start
    assert (await node.get("alice", claim.id)).state == "running"
    container_id = node.held.claims[claim.id].container_id
    for pid in cgroup_value(engine, engine.get(container_id), "pids", "cgroup.procs").split():
        os.kill(int(pid), signal.SIGKILL)

    async def shown_stopped() -> bool:
        return (await node.get("alice", claim.id)).state == "stopped"
    await until(shown_stopped)
    assert {info.id: info.state for info in await node.claims("alice")}[claim.id] == "stopped"
    with pytest.raises(SandboxNotRunning) as stopped:
        await run(node, "alice", claim.id, "true")
    assert claim.id in str(stopped.value) and container_id not in str(stopped.value)  # the engine's, retold
    assert (await node.reset("alice", claim.id)).state == "running"
    assert await run(node, "alice", claim.id, "echo back") == "back\n"
    assert (await node.get("alice", claim.id)).state == "running"
    await node.delete("alice", claim.id)


@contextlib.contextmanager
def agent_gone(engine: Engine) -> Iterator[None]:
    """The exec agent's binary missing from the host while the block runs: no container can start."""
    agent = engine.launcher.agent
    hidden = agent.with_name(agent.name + ".hidden")
    agent.rename(hidden)
    try:
        yield
    finally:
        hidden.rename(agent)


async def test_a_sandbox_that_fails_to_start_again_is_stopped_until_reset(node: LocalNode, engine: Engine) -> None:
    """A snapshot stops the sandbox's container and starts it again over its frozen files. When that start fails,
    the claim keeps its container, stopped: its calls say it is not running (never that it does not exist), and
    a reset brings it back."""
    claim = await node.claim("alice", ClaimRequest(template="basic"))
    with agent_gone(engine), pytest.raises(RollboxError) as failed:
        await node.snapshot("alice", claim.id, "relaunch")
    assert not isinstance(failed.value, NotFound), failed.value
    assert (await node.get("alice", claim.id)).state == "stopped"
    with pytest.raises(SandboxNotRunning, match=r"is stopped .*reset it") as stopped:
        await run(node, "alice", claim.id, "true")
    container_id = node.held.claims[claim.id].container_id
    assert claim.id in str(stopped.value) and container_id not in str(stopped.value)
    with pytest.raises(SandboxNotRunning):
        await node.files("alice", claim.id, "list", "/")
    assert (await node.reset("alice", claim.id)).state == "running"
    assert await run(node, "alice", claim.id, "echo back") == "back\n"
    assert (await node.get("alice", claim.id)).state == "running"
    await node.delete("alice", claim.id)


async def test_no_sandbox_inherits_the_nodes_descriptors(node: LocalNode, engine: Engine) -> None:
    """The node holds a pidfd of every warm sandbox (enough to kill it): none may reach another sandbox."""
    await node.apply(pool(replicas=2), print)
    await filled(node)

    async def both_watched() -> bool:  # a started container joins its pool, then its watch
        return len(node.resources.exits.watching()) >= 2
    await until(both_watched)
    claim = await node.claim("alice", ClaimRequest(template="basic", snapshot=None))
    await run(node, "alice", claim.id, "sleep 30 >/dev/null 2>&1 &")
    box = engine.get(node.held.claims[claim.id].container_id)
    inherited = {}
    for pid in cgroup_value(engine, box, "pids", "cgroup.procs").split():
        try:
            entries = list(Path(f"/proc/{pid}/fd").iterdir())
        except FileNotFoundError:  # exited since the listing (the exec's shell, say): it holds nothing now
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                inherited[f"{pid}/{entry.name}"] = os.readlink(entry)
    assert inherited
    node_kinds = ("anon_inode:[pidfd]", "anon_inode:[eventpoll]", "anon_inode:[eventfd]")  # the watch's
    assert not {fd: target for fd, target in inherited.items()
                if target in node_kinds or target.endswith((".db", ".db-wal", ".db-shm", ".db.lock"))}


async def test_one_node_per_data_directory(node: LocalNode, engine: Engine) -> None:
    with pytest.raises(Conflict, match="another rollbox process"):
        LocalNode(engine)


async def test_sandboxes_deleted_behind_the_nodes_back_are_forgotten(node: LocalNode, engine: Engine,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     restart: Callable[[LocalNode], LocalNode]
                                                                     ) -> None:
    monkeypatch.setattr("rollbox.node.sweeper.RECONCILE_EVERY", 0.1)
    node = restart(node)  # picks up the setting
    await node.apply(pool(replicas=1), print)
    await filled(node)
    claim = await node.claim("alice", ClaimRequest(template="basic"))
    await filled(node)
    engine.delete(node.held.claims[claim.id].container_id)
    engine.delete(node.resources.pools["basic-pool"].ready[0])

    async def forgotten() -> bool:
        return await node.claims("alice") == [] and (await node.health())["sandboxes"] == 1
    await until(forgotten)
    await filled(node)


async def test_deletions_wait_for_claims_to_pause_but_not_for_room(node: LocalNode, engine: Engine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandbox deleted during a stream of claims goes once the stream pauses, or after DELETE_HOLD_MAX while it
    goes on; a claim that waits for the room it frees does not wait for the stream."""
    monkeypatch.setattr(deletions, "DELETE_QUIET", 1.0)  # wide margins: a loaded machine still streams in time
    monkeypatch.setattr(deletions, "DELETE_HOLD_MAX", 4.0)
    first, second = [await node.claim("alice", ClaimRequest(template="basic")) for _ in range(2)]
    containers = [node.held.claims[claim.id].container_id for claim in (first, second)]
    streaming = True

    async def stream() -> None:  # claims that fail at once count as claims all the same
        while streaming:
            with pytest.raises(TemplateNotFound):
                await node.claim("bob", ClaimRequest(template="no-such-template"))
            await anyio.sleep(0.02)

    def exists(container_id: str) -> bool:
        return any(container.id == container_id for container in engine.list())

    async with anyio.create_task_group() as group:
        group.start_soon(stream)
        await anyio.sleep(0.1)
        started = time.monotonic()
        await node.delete("alice", first.id)
        await anyio.sleep(2.0)
        assert exists(containers[0]), "deleted while claims kept coming"
        await until(lambda: anyio.to_thread.run_sync(lambda: not exists(containers[0])))
        assert time.monotonic() - started < 15, "held past DELETE_HOLD_MAX"
        node.capacity.max_sandboxes = node.capacity.count  # full: the next claim waits for the deletion below
        await node.delete("alice", second.id)
        started = time.monotonic()
        claim = await node.claim("alice", ClaimRequest(template="basic"))
        assert time.monotonic() - started < 3.0, "a claim waiting for room waited for the stream"
        streaming = False
    assert not exists(containers[1])
    await node.delete("alice", claim.id)


async def test_a_container_deleted_behind_the_nodes_back_is_told_by_its_sandbox_id(node: LocalNode,
                                                                                 engine: Engine) -> None:
    """The engine's errors speak of containers; a tenant sees only its sandbox id, in errors too."""
    claim = await node.claim("alice", ClaimRequest(template="basic"))
    container_id = node.held.claims[claim.id].container_id
    engine.delete(container_id)
    with pytest.raises(SandboxNotFound) as stats:
        await node.stats("alice", claim.id)
    with pytest.raises(SandboxNotFound) as files:
        await node.files("alice", claim.id, "list", "/")
    for error in (stats.value, files.value):
        assert claim.id in str(error) and container_id not in str(error), error
        assert error.sandbox_id == claim.id and error.__cause__.container_id == container_id  # fields, not text
