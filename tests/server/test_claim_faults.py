"""Claims that survive faults on one machine, over a real engine and server, through the SDK and raw HTTP: a request
key sent again answers the same sandbox; a claim whose caller hung up ends; leases end their sandboxes when closed or
not renewed; a claim with neither lease nor `shutdown_after` gets the node's default; a restarted node keeps keys
and leases (docs/faults.md)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from rollbox import errors
from rollbox.client import SandboxClient
from rollbox.client import _calls as calls
from rollbox.engine import Engine
from rollbox.node import LocalNode, recovery
from rollbox.server import create_app
from rollbox.server.threaded import ThreadServer
from rollbox.spec import SandboxTemplate
from tests.support.cluster import wait_for
from tests.support.engines import BASIC, make_engine, teardown_engine

TOKENS = {"alice": "alice-token", "bob": "bob-token"}
DEFAULT = 900.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = make_engine(tmp_path_factory.mktemp("claim-faults"))
    engine.build(SandboxTemplate.model_validate(BASIC))
    yield engine
    teardown_engine(engine)


@contextlib.contextmanager
def serving(engine: Engine) -> Iterator[tuple[LocalNode, str]]:
    node = LocalNode(engine, max_sandboxes=8, tick=0.05, default_shutdown_after=DEFAULT)
    try:
        with ThreadServer(create_app(node, TOKENS), tcp=True) as server:
            yield node, server.url
    finally:
        node.close()


@pytest.fixture
def server(engine: Engine) -> Iterator[tuple[LocalNode, str]]:
    with serving(engine) as served:
        yield served
    engine.destroy_all()
    for path in engine.data_dir.glob("node.db*"):
        path.unlink()


def http(url: str, tenant: str = "alice") -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKENS[tenant]}"}, timeout=60)


def test_a_claim_sent_again_with_its_key_answers_the_same_sandbox(server: tuple[LocalNode, str]) -> None:
    node, url = server
    with http(url) as alice, http(url, "bob") as bob:
        first = alice.post("/v1/sandboxes", json={"template": "basic", "request_key": "step-1"})
        again = alice.post("/v1/sandboxes?retry=true", json={"template": "basic", "request_key": "step-1"})
        assert first.status_code == again.status_code == 201, (first.text, again.text)
        assert again.json()["id"] == first.json()["id"]
        found = alice.get("/v1/sandboxes", params={"request_key": "step-1"}).json()
        assert [info["id"] for info in found] == [first.json()["id"]]
        theirs = bob.post("/v1/sandboxes", json={"template": "basic", "request_key": "step-1"})  # keys are a tenant's
        assert theirs.json()["id"] != first.json()["id"]
        assert bob.get("/v1/sandboxes", params={"request_key": "nothing-made"}).json() == []
        with ThreadPoolExecutor(4) as pool:  # at once: the claims under way wait for the first
            ids = set(pool.map(lambda _: alice.post("/v1/sandboxes", json={"template": "basic", "request_key": "k2"})
                               .json()["id"], range(4)))
        assert len(ids) == 1
        assert len(node.held.claims) == 3
        bad = alice.post("/v1/sandboxes", json={"template": "basic", "request_key": "a/b"})
        assert bad.status_code == 422, bad.text


def claim_and_hang_up(url: str, claim: dict[str, object]) -> None:
    """Sends alice's claim and closes the connection without waiting for its answer."""
    parts = urlsplit(url)
    body = json.dumps(claim).encode()
    with socket.create_connection((parts.hostname, parts.port)) as caller:
        caller.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer alice-token\r\n"
                       b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


def test_a_claim_whose_caller_hung_up_before_its_answer_ends(server: tuple[LocalNode, str]) -> None:
    """Nobody would ever hold it: a caller that gave up (a router killed, nginx past its wait) leaves no sandbox."""
    node, url = server
    claim_and_hang_up(url, {"template": "basic", "labels": {"hung": "up"}})
    with http(url) as alice:  # made (a cold start, after the caller left), then ended
        wait_for(lambda: "rollbox_claims_total 1.0" in alice.get("/metrics").text, "the claim made")
        wait_for(lambda: not node.held.claims, "the claim ended")
        assert alice.get("/v1/sandboxes").json() == []


def test_a_sandbox_two_callers_of_one_key_both_left_ends(server: tuple[LocalNode, str]) -> None:
    """A node that answers late (frozen, swamped) can find two claims of the same key queued, both given up on (nginx's
    warm claim and the router's): the second waits for the first and is handed the same sandbox, which neither
    caller holds."""
    node, url = server
    for _ in range(2):
        claim_and_hang_up(url, {"template": "basic", "request_key": "both-left"})
    with http(url) as alice:
        wait_for(lambda: "rollbox_claims_total 2.0" in alice.get("/metrics").text, "both claims answered")
        wait_for(lambda: not node.held.claims, "the sandbox nobody holds ended")
        assert alice.get("/v1/sandboxes").json() == []


def test_a_lease_ends_its_sandboxes_when_closed_or_not_renewed(server: tuple[LocalNode, str]) -> None:
    node, url = server
    with SandboxClient(url, token=TOKENS["alice"]) as client:
        with client.lease(ttl=1.0) as lease:
            held = client.create_sandbox(template="basic")
            unleased = client.create_sandbox(template="basic", lease=None)
            assert held.info.lease == lease.id and unleased.info.lease is None
            time.sleep(2.5)  # renewed meanwhile, in the background
            assert held.run("echo alive").stdout == "alive\n"
            assert lease.renew().sandboxes == 1
        with pytest.raises(errors.SandboxNotFound):
            held.refresh()
        assert unleased.refresh().info.state == "running"
        # a trainer that died renews nothing: its sandboxes end within the lease's ttl (and a sweep)
        client._send(calls.renew_lease("crashed", 1.0))
        orphan = client.create_sandbox(template="basic", lease={"id": "crashed", "ttl": 1.0})
        forked = orphan.fork(1)[0]
        assert forked.info.lease == "crashed"
        started = time.monotonic()
        wait_for(lambda: not {orphan.id, forked.id} & set(node.held.claims), "the lease's sandboxes ended", 5)
        assert time.monotonic() - started < 2.5
        unleased.delete()


def test_a_claim_without_a_lease_gets_the_default_shutdown_after_unless_it_asks(
        server: tuple[LocalNode, str]) -> None:
    _, url = server
    with SandboxClient(url, token=TOKENS["alice"]) as client:
        default = client.create_sandbox(template="basic").info
        assert default.expires_at == pytest.approx(default.created_at + DEFAULT, abs=1)
        assert client.create_sandbox(template="basic", shutdown_after=None).info.expires_at is None
        assert client.create_sandbox(template="basic", shutdown_after=60).info.expires_at == pytest.approx(
            time.time() + 60, abs=5)
        with client.lease(ttl=30):
            assert client.create_sandbox(template="basic").info.expires_at is None  # the lease bounds it


def test_a_restarted_node_keeps_its_keys_and_leases_and_ends_what_may_never_have_been_answered(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node killed between recording a claim and answering it cannot tell whether the answer left: the claims of
    its last moments end unless a call names them soon after it restarts (CONFIRM_WINDOW, shortened here)."""
    monkeypatch.setattr(recovery, "CONFIRM_WINDOW", 1.0)
    try:
        with serving(engine) as (_, url), http(url) as alice:
            made = alice.post("/v1/sandboxes", json={"template": "basic", "request_key": "kept",
                                                     "lease": {"id": "trainer", "ttl": 3}}).json()
            named, unnamed = (alice.post("/v1/sandboxes", json={"template": "basic"}).json() for _ in range(2))
        with serving(engine) as (node, url), http(url) as alice:
            again = alice.post("/v1/sandboxes?retry=true", json={"template": "basic", "request_key": "kept",
                                                                "lease": {"id": "trainer", "ttl": 3}})
            assert again.json()["id"] == made["id"]
            assert alice.get(f"/v1/sandboxes/{named['id']}").status_code == 200
            wait_for(lambda: unnamed["id"] not in node.held.claims, "the unconfirmed claim ended", 5)
            assert named["id"] in node.held.claims and made["id"] in node.held.claims
            assert alice.put("/v1/leases/trainer", json={"ttl": 1}).json()["sandboxes"] == 1
            wait_for(lambda: made["id"] not in node.held.claims, "the lease, not renewed, ended", 5)
            assert named["id"] in node.held.claims
    finally:
        engine.destroy_all()
        for path in engine.data_dir.glob("node.db*"):
            path.unlink()
