"""The request path around the node: dispatch, auth, error answers, metrics, over a stub node in-process.

The server's own work per request is what these pin down, with no engine: the real node is
covered by test_node.py and test_server.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollbox.errors import SandboxNotFound
from rollbox.node.models import ClaimInfo, ClaimRequest
from rollbox.server import create_app

TOKENS = {"alice": "alice-token", "bob": "bob-token"}


class StubNode:
    """Claims in a dict; `claim` with template "boom" fails the way a bug would."""

    def __init__(self) -> None:
        self.claimed: dict[str, ClaimInfo] = {}

    async def claim(self, tenant: str, request: ClaimRequest) -> ClaimInfo:
        if request.template == "boom":
            raise RuntimeError("boom")
        info = ClaimInfo(id=f"c{len(self.claimed)}", template=request.template or "t", warmpool=request.warmpool,
                         tenant=tenant, state="running", created_at=time.time())
        self.claimed[info.id] = info
        return info

    async def get(self, tenant: str, claim_id: str) -> ClaimInfo:
        info = self.claimed.get(claim_id)
        if info is None or info.tenant != tenant:
            raise SandboxNotFound(f"sandbox {claim_id!r} does not exist")
        return info

    async def claims(self, tenant: str) -> list[ClaimInfo]:
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
