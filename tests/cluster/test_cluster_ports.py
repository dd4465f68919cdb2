"""Ports into sandboxes through a cluster's router (docs/ports.md): the router reaches a sandbox's port through a
tunnel to its node agent, and nginx at the edge sends traffic with a token it knows straight to that node. HTTP and
64 concurrent WebSocket echoes, with nginx at the edge and with the router passing everything itself."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import httpx
import pytest
import websocket

from rollbox.client import Sandbox, SandboxClient
from tests.cluster.conftest import NODES, POOL
from tests.support.cluster import ADMINS, TOKENS, Cluster, node_of, router_health, running_cluster, wait_for
from tests.support.port_server import start_port_server

pytestmark = pytest.mark.slow
ALICE = {"Authorization": f"Bearer {TOKENS['alice']}"}
ECHOES = 64
MESSAGES = 20


@pytest.fixture(scope="module", params=["nginx", "python"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("ports"), NODES, tokens=TOKENS, admins=ADMINS,
                         data_plane=request.param) as cluster:
        assert router_health(cluster.url)["data_plane"] == request.param
        yield cluster


@pytest.fixture(scope="module")
def sandboxes(client: SandboxClient) -> Iterator[list[Sandbox]]:
    """A serving sandbox on each node."""
    held: dict[str, Sandbox] = {}
    extra = []
    for _ in range(16):
        box = client.create_sandbox(warmpool=POOL)
        if node_of(box.id) in held:
            extra.append(box)
        else:
            held[node_of(box.id)] = box
        if len(held) == len(NODES):
            break
    for box in extra:
        box.delete()
    assert sorted(held) == sorted(NODES)
    for box in held.values():
        start_port_server(box, 8000)
        wait_for(lambda box=box: _status(box.url(8000, "/hello")) == 200, f"the server of {box.id} listens")
    yield list(held.values())
    for box in held.values():
        with contextlib.suppress(Exception):
            box.delete()


def _status(url: str, **headers: str) -> int | None:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, headers={**ALICE, **headers}, timeout=10).status_code
    return None


def test_http_and_streams_reach_a_sandbox_on_every_node(sandboxes: list[Sandbox], cluster: Cluster) -> None:
    for box in sandboxes:
        assert httpx.get(box.url(8000, "/hello"), headers=ALICE).text == "hello from sandbox"
        body = bytes(range(256)) * 4096
        assert httpx.post(box.url(8000, "/echo"), content=body, headers=ALICE).content == body
        with httpx.stream("GET", box.url(8000, "/stream?n=3"), headers=ALICE) as answer:
            assert [line for line in answer.iter_lines() if line] == ["data: 0", "data: 1", "data: 2"]
        token = box.traffic_token()
        by_token = httpx.get(f"{cluster.url}/hello", headers={"Host": f"8000-{box.id}.localhost",
                                                               token.header: token.token})
        assert by_token.text == "hello from sandbox"
        assert httpx.get(box.url(8000, "/hello"), headers={"Authorization": f"Bearer {TOKENS['bob']}"}
                         ).status_code == 404
        assert httpx.get(box.url(8000, "/hello")).status_code == 401
        closed = httpx.get(box.url(8001), headers=ALICE)
        assert closed.status_code == 502 and closed.json()["error"]["code"] == "port_closed"


def test_64_concurrent_websocket_echoes_lose_nothing(sandboxes: list[Sandbox]) -> None:
    lost: list[str] = []
    start = threading.Barrier(ECHOES)

    def echo(index: int) -> None:
        box = sandboxes[index % len(sandboxes)]
        try:
            connection = websocket.create_connection(box.url(8000, "/ws").replace("http://", "ws://"), timeout=60,
                                                     header=[f"Authorization: Bearer {TOKENS['alice']}"])
            start.wait(60)
            for number in range(MESSAGES):
                message = f"{index}:{number}:" + "x" * (number * 97)
                connection.send(message)
                if connection.recv() != message:
                    lost.append(f"{index}:{number}")
            connection.close()
        except Exception as error:  # counted as lost, with why
            lost.append(f"{index}: {error!r}")
            with contextlib.suppress(threading.BrokenBarrierError):
                start.abort()

    threads = [threading.Thread(target=echo, args=(index,)) for index in range(ECHOES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert lost == []


def test_a_node_agent_opens_ports_only_for_its_routers(sandboxes: list[Sandbox], cluster: Cluster) -> None:
    """The tunnel and the ports of a node agent take the cluster secret and a tenant, as its every other call."""
    box = sandboxes[0]
    agent = cluster.nodes[node_of(box.id)]
    path = f"{agent.url}/v1/sandboxes/{box.id}/ports/8000/hello"
    assert httpx.get(path).status_code == 401
    assert httpx.get(path, headers=ALICE).status_code == 401  # a tenant's token is no secret
    secret = {"Authorization": f"Bearer {cluster.secret_file.read_text().strip()}"}
    assert httpx.get(path, headers=secret).status_code == 401  # and the secret names no tenant
    assert httpx.get(path, headers={**secret, "X-Rollbox-Tenant": "bob"}).status_code == 404
    assert httpx.get(path, headers={**secret, "X-Rollbox-Tenant": "alice"}).text == "hello from sandbox"
    with pytest.raises(websocket.WebSocketBadStatusException):
        websocket.create_connection(f"{agent.url.replace('http', 'ws')}/v1/sandboxes/{box.id}/tunnel/8000",
                                    timeout=10, header=[f"Authorization: Bearer {TOKENS['alice']}"])
