"""The calls a router forwards as bytes, by nginx at its edge (cluster/edge.py) or by the router itself
(cluster/forwarding.py): answered exactly as the sandbox's node agent answers them, errors included, for the caller's
own sandboxes only, and counted in the router's metrics and command log as the API's routes count the calls they
serve. Every test runs on both data planes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollbox.client import Sandbox, SandboxClient
from rollbox.server.auth import TENANT_HEADER
from tests.cluster.conftest import NODES, POOL
from tests.support.cluster import ADMINS, TOKENS, Cluster, node_of, router_health, running_cluster, wait_for

CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "exec", {"json": {"command": "echo out; echo err >&2; exit 3"}}),
    ("POST", "exec", {"json": {"command": ["cat", "/etc/os-release"], "timeout": 10}}),
    ("POST", "exec", {"json": {"command": "sleep 5", "timeout": 0.2}}),
    ("POST", "exec", {"content": b"{not json"}),
    ("POST", "exec", {"json": {"command": 5}}),
    ("POST", "exec", {"json": ["echo", "hi"]}),
    ("PUT", "files", {"params": {"path": "/tmp/forwarded"}, "content": bytes(range(256)) * 8}),
    ("GET", "files", {"params": {"path": "/tmp/forwarded"}}),
    ("GET", "files", {"params": {"path": "/no/such/file"}}),
    ("GET", "files", {}),
    ("PUT", "files", {"params": {"path": "/tmp/forwarded", "mode": "not-a-mode"}, "content": b"x"}),
]
"""Each forwarded call, done well and badly."""


@pytest.fixture(scope="module", params=["nginx", "python"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster"), NODES, tokens=TOKENS, admins=ADMINS,
                         data_plane=request.param) as cluster:
        assert router_health(cluster.url)["data_plane"] == request.param
        yield cluster


@pytest.fixture(scope="module")
def sandbox(client: SandboxClient) -> Iterator[Sandbox]:
    sandbox = client.create_sandbox(warmpool=POOL)
    yield sandbox
    sandbox.delete()


def router_call(cluster: Cluster, token: str | None, method: str, path: str, **request: Any) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.request(method, f"{cluster.url}{path}", headers=headers, timeout=30, **request)


def node_call(cluster: Cluster, sandbox_id: str, method: str, path: str, **request: Any) -> httpx.Response:
    """The same call straight to the sandbox's node agent, as alice's router sends it."""
    headers = {"Authorization": f"Bearer {cluster.secret_file.read_text().strip()}", TENANT_HEADER: "alice"}
    return httpx.request(method, f"{cluster.nodes[node_of(sandbox_id)].url}{path}", headers=headers, timeout=30,
                         **request)


def shown(answer: httpx.Response) -> tuple[int, str | None, Any]:
    """What a caller reads of an answer: its status, media type and body (a command's duration left out)."""
    media_type = answer.headers.get("content-type")
    if media_type != "application/json":
        return answer.status_code, media_type, answer.content
    body = answer.json()
    if isinstance(body, dict):
        body.pop("duration_ms", None)
    return answer.status_code, media_type, body


@pytest.mark.parametrize(("method", "call", "request_"), CALLS,
                         ids=[f"{method}-{call}-{index}" for index, (method, call, _) in enumerate(CALLS)])
def test_a_forwarded_call_is_answered_as_the_node_answers_it(cluster: Cluster, sandbox: Sandbox, method: str,
                                                             call: str, request_: dict[str, Any]) -> None:
    path = f"/v1/sandboxes/{sandbox.id}/{call}"
    through_router = shown(router_call(cluster, TOKENS["alice"], method, path, **request_))
    assert through_router == shown(node_call(cluster, sandbox.id, method, path, **request_))
    assert through_router[0] < 500


def test_forwarded_calls_reach_only_the_callers_own_sandboxes(cluster: Cluster, sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/alices", b"alice's")
    for token, status, code in ((TOKENS["bob"], 404, "sandbox_not_found"), ("no-such-token", 401, "unauthorized"),
                                (None, 401, "unauthorized")):
        for method, call, request_ in (("POST", "exec", {"json": {"command": "echo bob > /tmp/alices"}}),
                                       ("GET", "files", {"params": {"path": "/tmp/alices"}}),
                                       ("PUT", "files", {"params": {"path": "/tmp/alices"}, "content": b"bob's"})):
            answer = router_call(cluster, token, method, f"/v1/sandboxes/{sandbox.id}/{call}", **request_)
            assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), (token, method, call)
    assert sandbox.files.read("/tmp/alices") == b"alice's"
    node, _, serial = sandbox.id.rpartition("-")
    for elsewhere in (f"nosuch-{serial}", f"{node}-{serial}%2F..%2F{serial}", f"..%2F{sandbox.id}"):
        answer = router_call(cluster, TOKENS["alice"], "POST", f"/v1/sandboxes/{elsewhere}/exec",
                             json={"command": "true"})
        assert answer.status_code == 404, (elsewhere, answer.text)


def test_forwarded_commands_are_counted_and_logged_by_the_router(cluster: Cluster, sandbox: Sandbox) -> None:
    def execs() -> float:
        text = router_call(cluster, None, "GET", "/metrics").text
        return float(re.search(r"^rollbox_execs_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]

    before = execs()
    for code in (0, 7):
        answer = router_call(cluster, TOKENS["alice"], "POST", f"/v1/sandboxes/{sandbox.id}/exec",
                             json={"command": f"exit {code}"})
        assert answer.json()["exit_code"] == code
    wait_for(lambda: execs() == before + 2, "both commands counted", timeout=5)  # nginx's lines come a moment later
    log = router_call(cluster, TOKENS["alice"], "GET", f"/dashboard/api/sandboxes/{sandbox.id}/commands").json()
    assert [(entry["command"], entry["exit_code"], entry["tenant"]) for entry in log[-2:]] == [
        ("exit 0", 0, "alice"), ("exit 7", 7, "alice")]
