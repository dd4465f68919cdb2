"""nginx at the router's edge (cluster/edge.py), attacked and broken: it claims, runs commands and moves files
straight on the nodes with the router's process stopped, counted by the router once it runs again; it passes a call
straight to a node only for a token it knows exactly, never lets a caller name its own tenant, leaves a claim no node
can take warm to the router, answers an oversized body as the API does, does
not run a command twice when its node dies during it, leaves a call whose node is restarting to the router, and
goes when the router is killed. A cluster of its own: these tests kill its processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollbox.client import Sandbox, SandboxClient
from rollbox.cluster import edge
from rollbox.cluster.view import RESTART_WAIT, NodeState
from rollbox.server.app import DEFAULT_MAX_BODY
from rollbox.server.auth import TENANT_HEADER
from rollbox.server.limits import too_large
from rollbox.server.listen import listen_tcp
from tests.cluster.conftest import NODES, POOL, SHARES
from tests.support.cluster import ADMINS, TOKENS, Cluster, router_health, running_cluster, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("edge"), NODES, tokens=TOKENS, admins=ADMINS,
                         data_plane="nginx") as cluster:
        assert router_health(cluster.url)["data_plane"] == "nginx"
        yield cluster


@pytest.fixture
def sandbox(client: SandboxClient) -> Iterator[Sandbox]:
    sandbox = client.create_sandbox(warmpool=POOL)
    yield sandbox
    with contextlib.suppress(Exception):
        sandbox.delete()


def exec_as(cluster: Cluster, headers: dict[str, str], sandbox_id: str, command: str) -> httpx.Response:
    return httpx.post(f"{cluster.url}/v1/sandboxes/{sandbox_id}/exec", headers=headers, json={"command": command},
                      timeout=30)


def test_only_a_token_known_exactly_is_a_tenant(cluster: Cluster, sandbox: Sandbox) -> None:
    """nginx matches plain strings in any case: a token that differs from alice's in case alone must not be hers."""
    sandbox.files.write("/tmp/alices", b"alice's")
    token = TOKENS["alice"]
    for wrong in (token.upper(), token.capitalize(), f"{token}x", token[:-1], token.replace("-", "_")):
        answer = exec_as(cluster, {"Authorization": f"Bearer {wrong}"}, sandbox.id, "echo x > /tmp/alices")
        assert answer.status_code == 401, (wrong, answer.text)
        assert answer.json()["error"]["code"] == "unauthorized"
    for scheme in ("bearer", "BEARER"):  # the router judges what nginx does not know, as it always did
        answer = exec_as(cluster, {"Authorization": f"{scheme} {token}"}, sandbox.id, "echo ok")
        assert answer.json()["stdout"] == "ok\n", (scheme, answer.text)
    assert sandbox.files.read("/tmp/alices") == b"alice's"


def test_a_caller_cannot_name_its_own_tenant(cluster: Cluster, sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/alices", b"alice's")
    secret = cluster.secret_file.read_text().strip()
    for authorization, status in ((f"Bearer {TOKENS['bob']}", 404), (None, 401), (f"Bearer {secret}", 401)):
        for name in (TENANT_HEADER, TENANT_HEADER.replace("-", "_"), TENANT_HEADER.upper()):
            headers = {name: "alice"} | ({} if authorization is None else {"Authorization": authorization})
            answer = exec_as(cluster, headers, sandbox.id, "echo x > /tmp/alices")
            assert answer.status_code == status, (authorization, name, answer.text)
            answer = httpx.put(f"{cluster.url}/v1/sandboxes/{sandbox.id}/files", params={"path": "/tmp/alices"},
                               headers=headers, content=b"bob's", timeout=30)
            assert answer.status_code == status, (authorization, name, answer.text)
    assert sandbox.files.read("/tmp/alices") == b"alice's"


def test_a_body_over_the_limit_is_answered_as_the_api_answers_it(cluster: Cluster, sandbox: Sandbox) -> None:
    """Declared too long, it is refused before a byte of it is read, with the API's own error."""
    port = int(cluster.url.rpartition(":")[2])
    for method, call in (("POST", "exec"), ("PUT", "files?path=/tmp/big"), ("POST", "claims")):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            connection.sendall(f"{method} /v1/sandboxes/{sandbox.id}/{call} HTTP/1.1\r\nHost: x\r\n"
                               f"Authorization: Bearer {TOKENS['alice']}\r\nContent-Type: application/json\r\n"
                               f"Content-Length: {DEFAULT_MAX_BODY + 1}\r\n\r\n".encode())
            head, body = _read_answer(connection)
        assert head.split()[1] == b"413", (call, head)
        expected = too_large(DEFAULT_MAX_BODY)
        assert httpx.Response(413, content=body).json() == {"error": {"code": expected.code,
                                                                      "message": str(expected)}}, (call, body)


def test_a_command_whose_node_dies_during_it_is_not_run_again(cluster: Cluster, client: SandboxClient,
                                                              sandbox: Sandbox) -> None:
    """nginx sent it, so the node may have run it: it answers 503 node_unavailable instead of passing it to the
    router, which would send it again once the node is back."""
    agent = cluster.nodes[sandbox.id.rpartition("-")[0]]
    answers: list[httpx.Response] = []
    running = threading.Thread(target=lambda: answers.append(exec_as(
        cluster, {"Authorization": f"Bearer {TOKENS['alice']}"}, sandbox.id, "echo ran >> /tmp/runs; sleep 2")))
    running.start()
    wait_for(lambda: _runs(client, sandbox.id) == 1, "the command running", 10)
    agent.kill()
    running.join(30)
    try:
        assert answers and answers[0].status_code == 503, answers[0].text if answers else "no answer"
        assert answers[0].json()["error"]["code"] == "node_unavailable"
    finally:
        agent.start()
    wait_for(lambda: router_health(cluster.url)["nodes"][agent.name]["status"] == "up", "the node back", 30)
    time.sleep(3)  # longer than the command: a second run would have written by now
    assert _runs(client, sandbox.id) == 1


def test_a_call_whose_node_is_down_answers_at_once_and_is_served_once_it_is_back(cluster: Cluster,
                                                                               sandbox: Sandbox) -> None:
    """Nothing reached the node: nginx passes the call to the router, which waits RESTART_WAIT for the node to
    restart, then answers 503 node_unavailable, marked not worth sending again, at once for as long as the node is
    down (nginx sends its calls to the router straight). Once the node is back, the call is served."""
    agent = cluster.nodes[sandbox.id.rpartition("-")[0]]
    alice = {"Authorization": f"Bearer {TOKENS['alice']}"}
    agent.kill()
    try:
        answers = []
        for _ in range(3):
            started = time.monotonic()
            answers.append((exec_as(cluster, alice, sandbox.id, "echo back"), time.monotonic() - started))
        for answer, _ in answers:
            assert answer.status_code == 503 and answer.json()["error"]["retry"] is False, answer.text
        assert answers[0][1] <= RESTART_WAIT + 1.0 and answers[2][1] < 0.5, [took for _, took in answers]
    finally:
        agent.start()
    wait_for(lambda: router_health(cluster.url)["nodes"][agent.name]["status"] == "up", "the node back", 30)
    answer = exec_as(cluster, alice, sandbox.id, "echo back")
    assert (answer.status_code, answer.json().get("stdout")) == (200, "back\n"), answer.text


def test_nginx_goes_when_the_router_is_killed(cluster: Cluster) -> None:
    """It must not keep the router's port, or answer for a router that is gone."""
    router = cluster.routers[0]
    assert router.process is not None
    edges = _children(router.process.pid)
    assert edges and all(Path(f"/proc/{pid}/exe").resolve().name == "nginx" for pid in edges)
    router.kill()
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in edges), "nginx gone", 5)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{router.url}/healthz", timeout=5)
    router.start()
    assert router_health(router.url)["data_plane"] == "nginx"


def _runs(client: SandboxClient, sandbox_id: str) -> int:
    """Lines the command wrote to /tmp/runs: once per run."""
    return int(client.get_sandbox(sandbox_id).run("cat /tmp/runs 2>/dev/null | wc -l").stdout.strip())


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _read_answer(connection: socket.socket) -> tuple[bytes, bytes]:
    """The head and body of one answer with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += connection.recv(65536) or b"\r\n\r\n"
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length:")), 0)
    while len(body) < length:
        chunk = connection.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


def test_an_episodes_calls_go_straight_to_the_nodes(cluster: Cluster, client: SandboxClient) -> None:
    """With the router's own process stopped (SIGSTOP), nginx still claims warm sandboxes, runs commands, moves
    files, describes a sandbox, reads its stats and deletes it, for the tenant of each token; back, the router has
    counted and logged them as its own, and forgotten the deleted sandbox's commands."""
    router = cluster.routers[0]
    assert router.process is not None
    before = _metric(cluster, "rollbox_claims_total"), _metric(cluster, "rollbox_execs_total")
    os.kill(router.process.pid, signal.SIGSTOP)
    try:
        with SandboxClient(cluster.url, token=TOKENS["alice"], timeout=10) as alice, \
                SandboxClient(cluster.url, token=TOKENS["bob"], timeout=10) as bob:
            mine = alice.create_sandbox(warmpool=POOL)
            theirs = bob.create_sandbox(warmpool=POOL)
            assert (mine.info.tenant, theirs.info.tenant) == ("alice", "bob")
            assert mine.run("echo straight").stdout == "straight\n"
            mine.files.write("/tmp/straight", b"bytes")
            assert mine.files.read("/tmp/straight") == b"bytes"
            assert mine.refresh().info.state == "running" and mine.stats().pids >= 1
            assert theirs.run("echo gone").exit_code == 0
            theirs.delete()
            named = httpx.post(f"{cluster.url}/v1/sandboxes", json={"warmpool": POOL}, timeout=10,
                               headers={"Authorization": f"Bearer {TOKENS['bob']}", TENANT_HEADER: "alice"})
            assert named.status_code == 201 and named.json()["tenant"] == "bob", named.text
    finally:
        os.kill(router.process.pid, signal.SIGCONT)
    wait_for(lambda: (_metric(cluster, "rollbox_claims_total"), _metric(cluster, "rollbox_execs_total")) == (
        before[0] + 3, before[1] + 2), "the claims and the commands counted by the router", 10)
    alices = {sandbox.id for sandbox in client.list_sandboxes()}
    assert mine.id in alices and theirs.id not in alices and named.json()["id"] not in alices
    assert [entry["command"] for entry in _commands(cluster, mine.id)] == ["echo straight"]
    assert _commands(cluster, theirs.id) == []
    client.get_sandbox(mine.id).delete()
    wait_for(lambda: _commands(cluster, mine.id) == [], "the deleted sandbox's commands forgotten", 10)
    with SandboxClient(cluster.url, token=TOKENS["bob"]) as bob:
        bob.get_sandbox(named.json()["id"]).delete()


def test_a_claim_no_node_can_take_warm_is_placed_by_the_router(cluster: Cluster, client: SandboxClient) -> None:
    """Every warm sandbox taken, the next claim starts cold where the router places it; a claim of a pool no node
    has is answered as the router answers it."""
    held = []
    try:
        for _ in range(sum(SHARES.values()) + 1):
            held.append(client.create_sandbox(warmpool=POOL))
        assert all(sandbox.run("echo up").stdout == "up\n" for sandbox in held)
    finally:
        for sandbox in held:
            sandbox.delete()
    answer = httpx.post(f"{cluster.url}/v1/sandboxes", json={"warmpool": "no-such-pool"}, timeout=30,
                        headers={"Authorization": f"Bearer {TOKENS['alice']}"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found", answer.text


def _commands(cluster: Cluster, sandbox_id: str) -> list[dict[str, object]]:
    answer = httpx.get(f"{cluster.url}/dashboard/api/sandboxes/{sandbox_id}/commands", timeout=10,
                       headers={"Authorization": f"Bearer {TOKENS['alice']}"})
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def _metric(cluster: Cluster, name: str) -> float:
    text = httpx.get(f"{cluster.url}/metrics", timeout=10).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"{name} ")))


def test_nginx_stops_with_the_router_even_while_it_reloads() -> None:
    """A reload opens nginx's pipe again, and that open waits for a reader with nginx's signals held: the router
    keeps reading until nginx is gone, so a stop right after a reload leaves nothing behind."""
    nginx = edge.available()
    assert nginx is not None, "the test set-up installs nginx"
    for _ in range(5):
        with listen_tcp("127.0.0.1", 0) as listener:
            port = listener.getsockname()[1]
            front = edge.Edge(listener, "127.0.0.1:9", "s" * 32, TOKENS, 1024, nginx)
            front.start({"alpha": NodeState("alpha", "http://127.0.0.1:9", "up", 0.0)})
            assert front._process is not None
            nginx_processes = [front._process.pid, *_children(front._process.pid)]
            assert front.update({"alpha": NodeState("alpha", "http://127.0.0.1:9", "joining", 0.0)})
            started = time.monotonic()
            front.close()
            assert time.monotonic() - started < edge.STOP_TIMEOUT, "nginx had to be killed"
            assert not [pid for pid in nginx_processes if Path(f"/proc/{pid}").exists()]
        with socket.create_server(("127.0.0.1", port)):  # the port is free again
            pass
