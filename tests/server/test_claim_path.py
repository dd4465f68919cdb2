"""The warm claim's path: dispatch, auth, error answers and metrics over a stub node in-process, then the
node's own part (claims and deletions written before they answer, in batches) over a real engine.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox.engine import Engine
from rollbox.errors import SandboxNotFound
from rollbox.models import ClaimRequest, SandboxInfo
from rollbox.node import LocalNode
from rollbox.server import create_app
from rollbox.spec import SandboxTemplate, SandboxWarmPool
from tests.support.engines import BASIC, make_engine, teardown_engine

TOKENS = {"alice": "alice-token", "bob": "bob-token"}


class StubNode:
    """Claims in a dict; `claim` with template "boom" fails the way a bug would."""

    def __init__(self) -> None:
        self.claimed: dict[str, SandboxInfo] = {}

    async def claim(self, tenant: str, request: ClaimRequest) -> SandboxInfo:
        if request.template == "boom":
            raise RuntimeError("boom")
        info = SandboxInfo(id=f"c{len(self.claimed)}", template=request.template or "t", warmpool=request.warmpool,
                         tenant=tenant, state="running", created_at=time.time())
        self.claimed[info.id] = info
        return info

    async def get(self, tenant: str, claim_id: str) -> SandboxInfo:
        info = self.claimed.get(claim_id)
        if info is None or info.tenant != tenant:
            raise SandboxNotFound(f"sandbox {claim_id!r} does not exist")
        return info

    async def claims(self, tenant: str) -> list[SandboxInfo]:
        return [info for info in self.claimed.values() if info.tenant == tenant]

    async def delete(self, tenant: str, claim_id: str) -> None:
        await self.get(tenant, claim_id)
        del self.claimed[claim_id]

    async def health(self) -> dict[str, Any]:
        return {"sandboxes": len(self.claimed), "claims": len(self.claimed), "pools": {}}


@pytest.fixture
def http() -> Iterator[httpx.AsyncClient]:
    app = create_app(StubNode(), TOKENS, max_body=1024)  # type: ignore[arg-type]
    yield httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://rollbox",
                            headers={"Authorization": "Bearer alice-token"})


def call(http: httpx.AsyncClient, method: str, path: str, **options: Any) -> httpx.Response:
    return asyncio.run(http.request(method, path, **options))


def error(response: httpx.Response, status: int, code: str, message: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"] == message if message else response.json()["error"]["message"]


def test_claim_get_list_delete(http: httpx.AsyncClient) -> None:
    created = call(http, "POST", "/v1/sandboxes", json={"warmpool": "p"})
    assert created.status_code == 201 and created.headers["content-type"] == "application/json"
    sandbox = created.json()
    assert sandbox["warmpool"] == "p" and sandbox["tenant"] == "alice" and sandbox["labels"] == {}
    assert call(http, "GET", f"/v1/sandboxes/{sandbox['id']}").json() == sandbox
    assert call(http, "GET", "/v1/sandboxes").json() == [sandbox]
    deleted = call(http, "DELETE", f"/v1/sandboxes/{sandbox['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    error(call(http, "GET", f"/v1/sandboxes/{sandbox['id']}"), 404, "sandbox_not_found")


def test_routes_as_before(http: httpx.AsyncClient) -> None:
    error(call(http, "GET", "/v1/nothing-here"), 404, "not_found", "no such route: see docs/api.md or /openapi.json")
    error(call(http, "GET", "/"), 404, "not_found")
    error(call(http, "PATCH", "/v1/sandboxes"), 405, "invalid_request", "Method Not Allowed")
    error(call(http, "POST", "/v1/sandboxes/x"), 405, "invalid_request")
    error(call(http, "GET", "/v1/sandboxes//exec"), 404, "not_found")
    head = call(http, "HEAD", "/healthz")
    assert head.status_code == 200 and head.content == b""
    moved = call(http, "GET", "/v1/sandboxes/", params={"a": "1"})
    assert moved.status_code == 307 and moved.headers["location"] == "http://rollbox/v1/sandboxes?a=1"


def test_tokens_and_tenants(http: httpx.AsyncClient) -> None:
    mine = call(http, "POST", "/v1/sandboxes", json={"template": "t"}).json()["id"]
    bob = {"Authorization": "Bearer bob-token"}
    error(call(http, "GET", f"/v1/sandboxes/{mine}", headers=bob), 404, "sandbox_not_found")
    error(call(http, "GET", "/v1/sandboxes", headers={"Authorization": ""}), 401, "unauthorized")
    error(call(http, "GET", "/v1/sandboxes", headers={"Authorization": "Bearer nope"}), 401, "unauthorized")
    error(call(http, "GET", "/v1/sandboxes", headers={"Authorization": "Basic alice-token"}), 401, "unauthorized")
    assert call(http, "GET", "/healthz", headers={"Authorization": ""}).json()["status"] == "ok"


def test_bad_bodies_and_failures(http: httpx.AsyncClient) -> None:
    error(call(http, "POST", "/v1/sandboxes", content=b"{nope"), 422, "invalid_request")
    error(call(http, "POST", "/v1/sandboxes", json={"warmpool": "p", "bogus": 1}), 422, "invalid_request")
    error(call(http, "POST", "/v1/sandboxes", json={"shutdown_after": "soon"}), 422, "invalid_request")
    error(call(http, "POST", "/v1/sandboxes", content=b"x" * 1025), 413, "too_large")
    error(call(http, "POST", "/v1/sandboxes", json={"template": "boom"}), 500, "internal",
          "the server failed: boom; see its log")
    metrics = call(http, "GET", "/metrics").text
    assert 'rollbox_failures_total{code="internal"} 1.0' in metrics
    assert 'rollbox_failures_total{code="not_found"}' not in metrics


def test_metrics_count_claims(http: httpx.AsyncClient) -> None:
    for _ in range(3):
        call(http, "POST", "/v1/sandboxes", json={"warmpool": "p"})
    call(http, "GET", "/v1/nothing")
    metrics = call(http, "GET", "/metrics").text
    assert "rollbox_claims_total 3.0" in metrics
    assert "rollbox_claim_seconds_count 3.0" in metrics
    assert 'rollbox_failures_total{code="not_found"} 1.0' in metrics
    assert call(http, "GET", "/openapi.json").json()["openapi"] == "3.1.0"


# -- the node's part, over a real engine ---------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = make_engine(tmp_path_factory.mktemp("claim-path"))
    engine.build(SandboxTemplate.model_validate(BASIC))
    yield engine
    teardown_engine(engine)


@pytest.fixture
def node(engine: Engine) -> Iterator[LocalNode]:
    node = LocalNode(engine, max_sandboxes=24)
    pool = SandboxWarmPool.model_validate({"metadata": {"name": "warm"}, "spec": {
        "replicas": 8, "refillConcurrency": 4, "sandboxTemplateRef": {"name": "basic"}}})
    asyncio.run(node.apply(pool, print))
    deadline = time.monotonic() + 60
    while len(node._pools["warm"].ready) < 8:
        assert time.monotonic() < deadline, "the pool did not fill"
        time.sleep(0.05)
    yield node
    node.close()
    engine.destroy_all()
    for path in Path(engine.data_dir).glob("node.db*"):
        path.unlink()


def stored(node: LocalNode) -> set[str]:
    return {claim.id for claim in node.store.claims()}


def test_claims_and_deletions_are_written_before_they_answer(node: LocalNode) -> None:
    async def main() -> None:
        claims = await asyncio.gather(*(node.claim("alice", ClaimRequest(warmpool="warm")) for _ in range(6)))
        ids = {claim.id for claim in claims}
        assert stored(node) == ids  # one transaction for the whole burst, committed before any answer
        gone = sorted(ids)[:4]
        let_go = {node._claims[claim_id].sandbox_id for claim_id in gone}
        await asyncio.gather(*(node.delete("alice", claim_id) for claim_id in gone))
        assert stored(node) == ids - set(gone)
        assert not {sandbox for sandbox, _ in node.store.pool_sandboxes()} & let_go
        assert [claim.id for claim in await node.claims("alice")] == [c.id for c in claims if c.id not in gone]
        with pytest.raises(SandboxNotFound):
            await node.delete("alice", gone[0])

    asyncio.run(main())


def test_a_crash_after_a_delete_or_reset_never_hands_the_used_sandbox_to_a_pool(
        node: LocalNode, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claimed sandbox keeps its pool row until its claim lets it go, in the same transaction: a node
    that dies before deleting the sandbox finds it held by nobody at restart, and deletes it."""
    async def used_then_crashed() -> set[str]:
        claims = [await node.claim("alice", ClaimRequest(warmpool="warm")) for _ in range(2)]
        used = {node._claims[claim.id].sandbox_id for claim in claims}
        monkeypatch.setattr(node, "_delete_later", lambda sandbox_id: None)  # dies before deleting anything
        await node.delete("alice", claims[0].id)
        await node.reset("alice", claims[1].id)
        return used

    used = asyncio.run(used_then_crashed())
    assert used <= {info.id for info in engine.list()}
    node.close()
    again = LocalNode(engine, max_sandboxes=24)
    try:
        assert not used & set(again._pools["warm"].ready)
        deadline = time.monotonic() + 30
        while used & {info.id for info in engine.list()}:
            assert time.monotonic() < deadline, "the used sandboxes were not deleted"
            time.sleep(0.05)
    finally:
        again.close()


def test_a_delete_waits_for_whatever_holds_the_claim(node: LocalNode) -> None:
    async def main() -> None:
        claim = await node.claim("alice", ClaimRequest(warmpool="warm"))
        lock = node._claims[claim.id].lock
        lock.acquire()
        threading.Timer(0.2, lock.release).start()
        started = time.monotonic()
        await node.delete("alice", claim.id)
        assert time.monotonic() - started >= 0.15
        assert claim.id not in stored(node)
        with pytest.raises(SandboxNotFound):
            await node.get("alice", claim.id)

    asyncio.run(main())


def test_claim_metrics_read_as_a_prometheus_counter_and_histogram() -> None:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from rollbox.server.metrics import CLAIM_BUCKETS, Metrics

    registry = CollectorRegistry()
    claims = Counter("rollbox_claims", "Sandboxes claimed", registry=registry)
    seconds = Histogram("rollbox_claim_seconds", "Time to answer a claim", buckets=CLAIM_BUCKETS, registry=registry)
    metrics = Metrics()
    for value in (0.0, 0.0005, 0.001, 0.0011, 0.003, 0.01, 2.5, 7.0, 20.0):
        claims.inc()
        seconds.observe(value)
        metrics.record_claim(value)
    created = re.compile(r"_created \S+")
    expected = created.sub("_created T", generate_latest(registry).decode())
    exposed = created.sub("_created T", metrics.render({"sandboxes": 0, "claims": 0, "pools": {}}).decode())
    assert exposed.startswith(expected)


def test_the_collector_is_settled_as_the_server_starts() -> None:
    import gc

    from rollbox.server.app import YOUNG_OBJECTS

    app = create_app(StubNode())  # type: ignore[arg-type]
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    threshold = gc.get_threshold()
    try:
        asyncio.run(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send))
        assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
        assert gc.get_threshold()[0] == YOUNG_OBJECTS and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
