"""Failures of a cluster without Ray (fixed node agents): a node agent killed and started again on its data
directory, a router killed and started again, and two routers in front of the same nodes."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox import errors
from rollbox.client import SandboxClient
from rollbox.cluster.remote import no_progress
from rollbox.cluster.router import RESTART_WAIT, ClusterNode
from rollbox.cluster.static import StaticMembers
from rollbox.cluster.watcher import SERVING
from rollbox.server.auth import TENANT_HEADER
from rollbox.server.sandboxes import ATTEMPT_HEADER
from rollbox.spec import SandboxTemplate, load_file
from tests.cluster.conftest import NODES, POOL
from tests.support.cluster import (
    ROLLBOX,
    TOKENS,
    Cluster,
    claim_on_every_node,
    node_agent,
    node_of,
    router_health,
    wait_for,
)
from tests.support.servers import RL_TEMPLATE

BACK_WITHIN = 10.0
"""Seconds after a node agent serves again by which the router serves its claims again."""
ALICE = {"Authorization": f"Bearer {TOKENS['alice']}"}


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds `call` took, and what it answered or raised."""
    started = time.monotonic()
    try:
        answer = call()
    except Exception as error:
        answer = error
    return time.monotonic() - started, answer


def test_a_killed_node_agent_started_again_adopts_its_sandboxes(cluster: Cluster, client: SandboxClient) -> None:
    """While alpha's agent is down, calls on its sandboxes answer 503 node_unavailable within RESTART_WAIT + 1 s,
    whether the router has noticed yet or not, and beta serves as before. Started again on its data directory (by
    the test: without Ray nothing restarts it), alpha's agent adopts its sandboxes, their processes alive, and the
    router serves them again within BACK_WITHIN of the agent answering."""
    held = claim_on_every_node(client, POOL, NODES)
    victim, other = held["alpha"], held["beta"]
    try:
        victim.files.write("before.txt", "written before the kill\n")
        sleeper = victim.run("setsid nohup sleep 1000 >/dev/null 2>&1 & echo $!")
        assert sleeper.exit_code == 0, sleeper
        cluster.nodes["alpha"].kill()

        with httpx.Client(base_url=cluster.url, headers=ALICE, timeout=30) as http, ThreadPoolExecutor(8) as pool:
            def calls(when: str) -> dict[str, Future[tuple[float, Any]]]:
                return {
                    f"{when} get": pool.submit(timed, lambda: http.get(f"/v1/sandboxes/{victim.id}")),
                    f"{when} exec": pool.submit(timed, lambda: http.post(f"/v1/sandboxes/{victim.id}/exec",
                                                                          json={"command": "echo hi"})),
                    f"{when} read": pool.submit(timed, lambda: http.get(f"/v1/sandboxes/{victim.id}/files",
                                                                         params={"path": "before.txt"})),
                    f"{when} streamed": pool.submit(timed, lambda: victim.commands.run(
                        "echo hi", on_stdout=lambda _: None)),
                }

            down = calls("at once")  # the router still counts alpha up: the calls find it gone
            wait_for(lambda: router_health(cluster.url)["nodes"]["alpha"]["status"] == "unreachable",
                     "the router counting alpha unreachable", RESTART_WAIT)
            down |= calls("unreachable")
            for took, result in [timed(lambda: other.run("echo untouched")) for _ in range(3)]:
                assert result.stdout == "untouched\n" and took < RESTART_WAIT / 2, (took, result)
            took, claimed = timed(lambda: client.create_sandbox(warmpool=POOL))
            assert not isinstance(claimed, Exception), claimed
            assert node_of(claimed.id) == "beta" and took < RESTART_WAIT / 2, (claimed.id, took)
            claimed.delete()
            for what, future in down.items():
                took, answer = future.result()
                assert took <= RESTART_WAIT + 1.0, f"{what} answered after {took:.1f} s"
                if isinstance(answer, httpx.Response):
                    assert answer.status_code == 503, (what, answer.status_code, answer.text)
                    assert answer.json()["error"]["code"] == "node_unavailable", (what, answer.text)
                else:
                    assert isinstance(answer, errors.NodeUnavailable), (what, answer)

        cluster.nodes["alpha"].start()
        restarted = time.monotonic()
        wait_for(lambda: _answers(client, victim.id), f"{victim.id} served again", BACK_WITHIN, every=0.1)
        back = time.monotonic() - restarted
        assert back <= BACK_WITHIN, f"claims on the restarted node answered {back:.1f} s after it served"
        assert victim.refresh().info.state == "running"
        assert victim.files.read_text("before.txt") == "written before the kill\n"
        assert victim.run(f"kill -0 {sleeper.stdout.strip()} && echo alive").stdout == "alive\n"
        # calls on one sandbox go straight to its node; the router lists a node's sandboxes once it has seen it back
        wait_for(lambda: victim.id in {sandbox.id for sandbox in client.list_sandboxes()}, "the router listing it",
                 RESTART_WAIT)
        assert other.run("echo still").stdout == "still\n"
        # back, it answers for its sandboxes at once and takes new claims once its templates are checked
        wait_for(lambda: router_health(cluster.url)["nodes"]["alpha"]["status"] == "up", "alpha serving again",
                 RESTART_WAIT)
    finally:
        for sandbox in held.values():
            with contextlib.suppress(errors.RollboxError):  # alpha may be down still: its `rollbox down` deletes
                sandbox.delete()


def _answers(client: SandboxClient, sandbox_id: str) -> bool:
    try:
        return client.get_sandbox(sandbox_id).run("echo back").stdout == "back\n"
    except (errors.NodeUnavailable, errors.ConnectionFailed):
        return False


def test_a_killed_router_started_again_serves_every_live_claim(cluster: Cluster, client: SandboxClient) -> None:
    held = [client.create_sandbox(warmpool=POOL) for _ in range(4)]
    held += claim_on_every_node(client, POOL, NODES).values()
    try:
        for number, sandbox in enumerate(held):
            sandbox.files.write("mark.txt", f"{number}\n")
        router = cluster.routers[0]
        router.kill()
        with pytest.raises(errors.ConnectionFailed):
            client.list_sandboxes()
        router.start()
        wait_for(lambda: all(node["status"] == "up" for node in router_health(router.url)["nodes"].values()),
                 "the restarted router's nodes up", 30)
        assert {sandbox.id for sandbox in held} <= {sandbox.id for sandbox in client.list_sandboxes()}
        for number, sandbox in enumerate(held):
            assert client.get_sandbox(sandbox.id).info.state == "running"
            assert sandbox.run("cat mark.txt").stdout == f"{number}\n", sandbox.id
        (pool,) = client.list_warmpools()
        assert (pool.name, pool.replicas) == (POOL, 8)
    finally:
        for sandbox in held:
            sandbox.delete()


def test_two_routers_serve_each_others_claims(cluster: Cluster, client: SandboxClient) -> None:
    second = cluster.add_router()
    with SandboxClient(second.url, token=TOKENS["alice"]) as other:
        assert [(pool.name, pool.replicas) for pool in other.list_warmpools()] == [(POOL, 8)]
        for first_router, second_router in ((client, other), (other, client)):
            made = claim_on_every_node(first_router, POOL, NODES)
            for name, sandbox in made.items():
                served = second_router.get_sandbox(sandbox.id)
                assert served.info.tenant == "alice" and node_of(served.id) == name
                served.files.write("via.txt", "the other router\n")
                assert sandbox.files.read_text("via.txt") == "the other router\n"
                assert served.run("cat via.txt").stdout == "the other router\n"
                streamed: list[str] = []
                served.commands.run("echo one; sleep 0.2; echo two", on_stdout=streamed.append)
                assert "".join(streamed) == "one\ntwo\n"
                served.delete()
                with pytest.raises(errors.SandboxNotFound):
                    first_router.get_sandbox(sandbox.id)
    second.stop()
    cluster.routers.remove(second)


def test_a_node_gone_since_the_routers_last_look_answers_503(cluster: Cluster, tmp_path: Path) -> None:
    """A router learns of a dead node agent at its next look: a template applied, or the templates read, before then
    answer 503 (try again), not a server failure. The router here never looks again, so the window stays open."""
    agent = node_agent(tmp_path, "gamma", cluster.secret_file, max_sandboxes=2)
    agent.start()
    template = next(r for r in load_file(RL_TEMPLATE) if isinstance(r, SandboxTemplate))

    async def scenario() -> None:
        router = ClusterNode(StaticMembers([agent.url]), cluster.secret_file.read_text(), tick=3600)
        await router.start()
        try:
            assert router.watcher.view["gamma"].status in SERVING
            agent.kill()
            with pytest.raises(errors.NodeUnavailable, match="try again"):
                await router.apply(template, no_progress)
            with pytest.raises(errors.NodeUnavailable, match="try again"):
                await router.templates()
        finally:
            await router.close()

    try:
        asyncio.run(scenario())
    finally:
        agent.kill()
        down = subprocess.run([str(ROLLBOX), "down", "--data-dir", str(agent.data_dir)], capture_output=True,
                              text=True, timeout=120)
        assert down.returncode == 0, down.stderr


def test_a_claim_sent_again_through_another_router_answers_the_same_sandbox(cluster: Cluster,
                                                                           client: SandboxClient) -> None:
    """The nodes keep the request keys: a claim whose answer was lost, sent again (`retry`) through any router, is
    answered with the sandbox the first attempt made, on whichever node it is."""
    second = cluster.add_router()
    try:
        made = {}
        for number in range(4):  # warm claims: nginx picks the node
            body = {"warmpool": POOL, "request_key": f"step-{number}"}
            first = httpx.post(f"{cluster.url}/v1/sandboxes", json=body, headers=ALICE, timeout=30)
            assert first.status_code == 201, first.text
            made[number] = first.json()["id"]
            again = httpx.post(f"{second.url}/v1/sandboxes?retry=true", json=body, headers=ALICE, timeout=30)
            assert (again.status_code, again.json()["id"]) == (201, made[number]), again.text
        found = httpx.get(f"{second.url}/v1/sandboxes", params={"request_key": "step-0"}, headers=ALICE, timeout=30)
        assert [info["id"] for info in found.json()] == [made[0]]
        assert {node_of(sandbox_id) for sandbox_id in made.values()} <= set(NODES)
    finally:
        for sandbox_id in made.values():
            client.delete_sandbox(sandbox_id)
        second.stop()
        cluster.routers.remove(second)


def test_a_lease_lives_on_the_nodes_through_a_router_restart(cluster: Cluster, client: SandboxClient) -> None:
    """Renewed through whichever router answers, the lease outlives the router's restart; closed, its sandboxes end on
    every node."""
    with client.lease(ttl=30) as lease:
        held = claim_on_every_node(client, POOL, NODES)
        assert {sandbox.info.lease for sandbox in held.values()} == {lease.id}
        router = cluster.routers[0]
        router.kill()
        router.start()
        wait_for(lambda: all(node["status"] == "up" for node in router_health(router.url)["nodes"].values()),
                 "the restarted router's nodes up", 30)
        assert lease.renew().sandboxes == len(NODES)
        for sandbox in held.values():
            assert sandbox.run("echo held").stdout == "held\n"
    for sandbox in held.values():
        with pytest.raises(errors.SandboxNotFound):
            sandbox.refresh()


def test_a_node_ends_a_claim_whose_answer_its_router_withdraws(cluster: Cluster, client: SandboxClient) -> None:
    """A caller that was there when the node answered may drop the answer after all (nginx past its wait, a router
    whose own caller left): it withdraws the attempt by its id, and the sandbox nobody holds ends. A withdrawal that
    reaches the node first (both queued while it was frozen) settles the claim as not taken. Tenants' tokens cannot
    withdraw."""
    node = cluster.nodes["alpha"].url
    secret = {"Authorization": f"Bearer {cluster.secret_file.read_text().strip()}", TENANT_HEADER: "alice"}

    def claim(attempt: str) -> str:
        made = httpx.post(f"{node}/v1/sandboxes", json={"warmpool": POOL}, timeout=30,
                          headers={**secret, ATTEMPT_HEADER: attempt})
        assert made.status_code == 201, made.text
        return made.json()["id"]

    def held(sandbox_id: str) -> bool:
        return httpx.get(f"{node}/v1/sandboxes/{sandbox_id}", headers=secret, timeout=30).status_code == 200

    def withdraw(*attempts: str, headers: dict[str, str] = secret) -> int:
        return httpx.post(f"{node}/v1/withdrawals", json={"attempts": list(attempts)}, headers=headers,
                          timeout=30).status_code

    kept, dropped = claim("kept-1"), claim("dropped-1")
    assert withdraw("dropped-1", "never-sent") == 204
    wait_for(lambda: not held(dropped), "the withdrawn claim ended", 10)
    assert held(kept)
    assert withdraw("early-1") == 204
    early = claim("early-1")
    wait_for(lambda: not held(early), "the claim withdrawn before it was made ended", 10)
    assert withdraw("kept-1", headers=ALICE) in (401, 403)
    assert httpx.post(f"{cluster.url}/v1/withdrawals", json={"attempts": ["kept-1"]}, headers=ALICE,
                      timeout=30).status_code == 404  # no such call on the router
    assert held(kept)
    client.delete_sandbox(kept)
