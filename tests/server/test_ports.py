"""Ports into a sandbox through a real `rollbox serve` (docs/ports.md): HTTP, streamed answers and WebSockets to a
server listening inside a sandbox, under runc and gVisor, addressed by path and by host, for the tenant and for
holders of the traffic token only."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import websocket

from rollbox.client import SandboxClient
from rollbox.client.sync import Sandbox
from rollbox.engine import Engine
from tests.support.cluster import Process, wait_for
from tests.support.engines import teardown_engine
from tests.support.port_server import start_port_server
from tests.support.servers import TOKENS

TEMPLATES = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: web}
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: web-gvisor}
spec: {runtime: runsc}
"""
ALICE = {"Authorization": f"Bearer {TOKENS['alice']}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("ports")
    tokens = [arg for tenant, token in TOKENS.items() for arg in ("--token", f"{tenant}={token}")]
    process = Process(["serve", "--data-dir", str(root / "data"), *tokens, "--admin", "alice", "--delete-on-exit"],
                      root / "serve.log")
    process.start()
    try:
        with SandboxClient(process.url, token=TOKENS["alice"]) as client:
            client.apply(TEMPLATES)
        yield process
    finally:
        process.stop()
        teardown_engine(Engine(root / "data"))


@pytest.fixture(scope="module")
def client(server: Process) -> Iterator[SandboxClient]:
    with SandboxClient(server.url, token=TOKENS["alice"]) as alice:
        yield alice


@pytest.fixture(scope="module", params=["web", "web-gvisor"])
def sandbox(request: pytest.FixtureRequest, client: SandboxClient) -> Iterator[Sandbox]:
    with client.create_sandbox(template=request.param) as box:
        start_port_server(box, 8000)
        wait_for(lambda: _get(box.url(8000, "/hello")) == 200, "the server in the sandbox listens")
        yield box


def _get(url: str) -> int | None:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, headers=ALICE).status_code
    return None


def _ws(url: str, **options: object) -> websocket.WebSocket:
    return websocket.create_connection(url.replace("http://", "ws://", 1), timeout=10, **options)


def test_http_through_the_router_for_the_tenant(sandbox: Sandbox) -> None:
    answer = httpx.get(sandbox.url(8000, "/hello"), headers=ALICE)
    assert (answer.status_code, answer.text) == (200, "hello from sandbox")
    big = bytes(range(256)) * 8192  # 2 MiB each way
    echoed = httpx.post(sandbox.url(8000, "/echo"), content=big, headers=ALICE)
    assert echoed.content == big
    chunked = httpx.post(sandbox.url(8000, "/echo"), content=iter([b"a" * 1000, b"b" * 1000]), headers=ALICE)
    assert chunked.content == b"a" * 1000 + b"b" * 1000
    seen = httpx.get(sandbox.url(8000, "/headers?x=1"), headers={**ALICE, "X-Custom": "kept"}).json()
    assert seen["target"] == "/headers?x=1"
    assert seen["headers"]["x-custom"] == "kept"
    assert "authorization" not in seen["headers"]  # the tenant's token never reaches the sandbox
    assert seen["headers"]["x-forwarded-prefix"] == f"/v1/sandboxes/{sandbox.id}/ports/8000"


def test_a_streamed_answer_arrives_as_it_is_made(sandbox: Sandbox) -> None:
    arrivals = []
    started = time.monotonic()
    with httpx.stream("GET", sandbox.url(8000, "/stream?n=5"), headers=ALICE) as answer:
        for line in answer.iter_lines():
            if line:
                arrivals.append((line, time.monotonic() - started))
    assert [line for line, _ in arrivals] == [f"data: {n}" for n in range(5)]
    assert arrivals[0][1] < arrivals[-1][1] - 0.5  # 0.8 s apart at the server: not held back until the end


def test_websockets_pass_both_ways(sandbox: Sandbox) -> None:
    connection = _ws(sandbox.url(8000, "/ws"), header=[f"Authorization: Bearer {TOKENS['alice']}"],
                     subprotocols=["echo.v1"])
    try:
        assert connection.subprotocol == "echo.v1"
        connection.send("hello")
        assert connection.recv() == "hello"
        connection.send_binary(b"\x00\xff" * 40_000)
        assert connection.recv() == b"\x00\xff" * 40_000
    finally:
        connection.close()


def test_only_the_tenant_or_a_traffic_token_holder_gets_in(sandbox: Sandbox, client: SandboxClient,
                                                           server: Process) -> None:
    url = sandbox.url(8000, "/headers")
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer nobody"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {TOKENS['bob']}"}).status_code == 404  # not bob's
    token = sandbox.traffic_token()
    answer = httpx.get(url, headers={token.header: token.token, "Authorization": "Basic app-credentials"})
    assert answer.status_code == 200
    assert answer.json()["headers"]["authorization"] == "Basic app-credentials"  # the app's own, passed on
    assert "x-rollbox-traffic-token" not in answer.json()["headers"]
    assert httpx.get(url, headers={token.header: token.token + "0"}).status_code == 401
    with client.create_sandbox(template="web") as other:
        assert httpx.get(other.url(8000), headers={token.header: token.token}).status_code == 401
        bob = SandboxClient(server.url, token=TOKENS["bob"])
        with pytest.raises(Exception, match="does not exist"):
            bob.get_sandbox(other.id).traffic_token()
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        _ws(sandbox.url(8000, "/ws"))
    assert refused.value.status_code == 401


def test_host_addressing_as_e2b_get_host_writes_it(sandbox: Sandbox, server: Process) -> None:
    host = f"8000-{sandbox.id}.localhost:{server.port}"
    token = sandbox.traffic_token()
    answer = httpx.get(f"{server.url}/hello", headers={"Host": host, token.header: token.token})
    assert (answer.status_code, answer.text) == (200, "hello from sandbox")
    assert httpx.get(f"{server.url}/hello", headers={"Host": host}).status_code == 403
    assert httpx.get(f"{server.url}/healthz", headers={"Host": "8000-x.example.com"}).status_code == 200  # no domain
    connection = _ws(f"{server.url}/ws", host=host, header=[f"X-Rollbox-Traffic-Token: {token.token}"])
    connection.send("over the host")
    assert connection.recv() == "over the host"
    connection.close()


def test_a_closed_port_and_a_bad_one(sandbox: Sandbox) -> None:
    closed = httpx.get(sandbox.url(8001), headers=ALICE)
    assert closed.status_code == 502 and closed.json()["error"]["code"] == "port_closed"
    assert httpx.get(sandbox.url(8000).replace("/8000/", "/99999/"), headers=ALICE).status_code == 400


@pytest.mark.parametrize("template", ["web", "web-gvisor"])
def test_a_paused_sandbox_resumes_on_traffic(client: SandboxClient, template: str) -> None:
    """Under gVisor the pause is a standby on disk; runsc saves a server waiting in poll(), as Python's http.server
    does, but not one waiting in epoll on its listening socket (asyncio's), so this one runs http.server."""
    with client.create_sandbox(template=template) as box:
        box.commands.run("python3 -m http.server 8002", background=True)
        wait_for(lambda: _get(box.url(8002)) == 200, "the server listens")
        box.pause()
        assert box.refresh().info.state == "paused"
        assert httpx.get(box.url(8002), headers=ALICE).status_code == 200
        assert box.refresh().info.state == "running"


def test_a_tunnel_carries_raw_bytes(sandbox: Sandbox, server: Process) -> None:
    tunnel = _ws(f"{server.url}/v1/sandboxes/{sandbox.id}/tunnel/8000",
                 header=[f"Authorization: Bearer {TOKENS['alice']}"])
    try:
        tunnel.send_binary(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"hello from sandbox"):
            answer += tunnel.recv()
        assert answer.startswith(b"HTTP/1.1 200 OK")
    finally:
        tunnel.close()


def test_the_sandbox_still_has_no_way_out(sandbox: Sandbox, server: Process) -> None:
    """Traffic comes in; nothing goes out: the router's own port is as unreachable from inside as before."""
    probe = (f"python3 -c \"import socket; s=socket.socket(); s.settimeout(2); "
             f"print(s.connect_ex(('127.0.0.1', {server.port})))\"")
    assert sandbox.run(probe).stdout.strip() not in ("0", "")  # its own loopback has no router
    host_address = _host_address()
    if host_address:
        outside = sandbox.run(probe.replace("127.0.0.1", host_address))
        assert outside.stdout.strip() != "0"


def _host_address() -> str | None:
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))
        return probe.getsockname()[0]
    return None


def test_traffic_is_use(client: SandboxClient) -> None:
    """A sandbox with traffic in flight is not idle: idle pause waits for the connection to end."""
    with client.create_sandbox(template="web", idle_pause_after=1) as box:
        start_port_server(box, 8000)
        wait_for(lambda: _get(box.url(8000, "/hello")) == 200, "the server listens")
        connection = _ws(box.url(8000, "/ws"), header=[f"Authorization: Bearer {TOKENS['alice']}"])
        time.sleep(2.5)
        assert box.refresh().info.state == "running"
        connection.send("still here")
        assert connection.recv() == "still here"
        connection.close()
        wait_for(lambda: box.refresh().info.state == "paused", "idle once the traffic ended", timeout=20)
