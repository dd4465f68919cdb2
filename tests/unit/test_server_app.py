"""The router's HTTP contract (docs/api.md) in-process, over `MemoryNode`: routes, auth, error bodies, limits."""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from rollbox.server import create_app
from rollbox.server.app import YOUNG_OBJECTS
from tests.unit.in_process import MAX_BODY, client_of
from tests.unit.memory_node import FAILING_TEMPLATE, MemoryNode

pytestmark = pytest.mark.anyio
BOB = {"Authorization": "Bearer bob-token"}
TEMPLATE = {"apiVersion": "rollbox.dev/v1alpha1", "kind": "SandboxTemplate", "metadata": {"name": "basic"},
            "spec": {"steps": [{"run": "true"}]}}


def error(response: httpx.Response, status: int, code: str, message: str | None = None) -> None:
    """The one error shape: `{"error": {"code", "message"}}` as JSON, with the status of the error's class."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"] and body["error"]["code"] == code and body["error"]["message"]
    if message is not None:
        assert body["error"]["message"] == message


async def claim(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    created = await http.post("/v1/sandboxes", json=body)
    assert created.status_code == 201, created.text
    return created.json()


# -- claims and routes ------------------------------------------------------------------------------

async def test_claim_get_list_delete(http: httpx.AsyncClient) -> None:
    created = await http.post("/v1/sandboxes", json={"warmpool": "p"})
    assert created.status_code == 201 and created.headers["content-type"] == "application/json"
    sandbox = created.json()
    assert sandbox["warmpool"] == "p" and sandbox["tenant"] == "alice" and sandbox["labels"] == {}
    assert (await http.get(f"/v1/sandboxes/{sandbox['id']}")).json() == sandbox
    assert (await http.get("/v1/sandboxes")).json() == [sandbox]
    deleted = await http.delete(f"/v1/sandboxes/{sandbox['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    error(await http.get(f"/v1/sandboxes/{sandbox['id']}"), 404, "sandbox_not_found")


async def test_routes_as_before(http: httpx.AsyncClient) -> None:
    error(await http.get("/v1/nothing-here"), 404, "not_found", "no such route: see docs/api.md or /openapi.json")
    error(await http.get("/"), 404, "not_found")
    error(await http.patch("/v1/sandboxes"), 405, "invalid_request", "Method Not Allowed")
    error(await http.post("/v1/sandboxes/x"), 405, "invalid_request")
    error(await http.get("/v1/sandboxes//exec"), 404, "not_found")
    head = await http.head("/healthz")
    assert head.status_code == 200 and head.content == b""
    moved = await http.get("/v1/sandboxes/", params={"a": "1"})
    assert moved.status_code == 307 and moved.headers["location"] == "http://rollbox/v1/sandboxes?a=1"


async def test_a_sandbox_answers_every_call_on_it(http: httpx.AsyncClient) -> None:
    sandbox = (await claim(http, template="basic"))["id"]
    ran = await http.post(f"/v1/sandboxes/{sandbox}/exec", json={"command": ["echo", "hi"]})
    assert ran.json()["exit_code"] == 0 and ran.json()["stdout"] == "echo hi\n"
    assert (await http.post(f"/v1/sandboxes/{sandbox}/pause")).json()["state"] == "paused"
    assert (await http.post(f"/v1/sandboxes/{sandbox}/resume")).json()["state"] == "running"
    children = (await http.post(f"/v1/sandboxes/{sandbox}/fork", json={"count": 2})).json()
    assert [child["parent"] for child in children] == [sandbox, sandbox]
    assert (await http.get(f"/v1/sandboxes/{sandbox}/stats")).json()["pids"] == 1
    assert (await http.post(f"/v1/sandboxes/{sandbox}/reset")).json()["id"] == sandbox
    snapshot = await http.post(f"/v1/sandboxes/{sandbox}/snapshot", json={"name": "s1"})
    assert snapshot.json()["source"] == sandbox
    assert [s["name"] for s in (await http.get("/v1/snapshots")).json()] == ["s1"]
    assert (await http.delete("/v1/snapshots/s1")).status_code == 204
    error(await http.delete("/v1/snapshots/s1"), 404, "snapshot_not_found")


async def test_exec_streams_output_lines_then_the_result_or_fails_as_a_plain_error(http: httpx.AsyncClient) -> None:
    sandbox = (await claim(http))["id"]
    streamed = await http.post(f"/v1/sandboxes/{sandbox}/exec/stream", json={"command": "fail 3"})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("application/x-ndjson")
    events = [json.loads(line) for line in streamed.text.splitlines()]
    assert events[0] == {"type": "stderr", "data": "failed\n"}
    assert events[-1]["type"] == "result" and events[-1]["result"]["exit_code"] == 3
    error(await http.post("/v1/sandboxes/nope/exec/stream", json={"command": "true"}), 404, "sandbox_not_found")


async def test_files_round_trip_as_bytes(http: httpx.AsyncClient) -> None:
    sandbox = (await claim(http))["id"]
    files = f"/v1/sandboxes/{sandbox}/files"
    assert (await http.put(files, params={"path": "/a.bin"}, content=b"\x00\xff")).status_code == 204
    read = await http.get(files, params={"path": "/a.bin"})
    assert read.content == b"\x00\xff" and read.headers["content-type"] == "application/octet-stream"
    assert (await http.get(f"{files}/stat", params={"path": "/a.bin"})).json()["size"] == 2
    error(await http.get(files, params={"path": "/missing"}), 404, "file_not_found")
    error(await http.get(files), 422, "invalid_request", "invalid request: query parameter 'path' is required")
    error(await http.put(files, params={"path": "/b", "mode": "rw"}, content=b""), 422, "invalid_request")


async def test_resources_are_applied_by_an_admin_and_read_by_anyone(http: httpx.AsyncClient) -> None:
    applied = await http.post("/v1/apply", json={"documents": [TEMPLATE]})
    events = [json.loads(line) for line in applied.text.splitlines()]
    assert [e["event"] for e in events] == ["progress", "applied", "done"] and events[1]["status"] == "created"
    assert [t["name"] for t in (await http.get("/v1/templates", headers=BOB)).json()] == ["basic"]
    error(await http.post("/v1/apply", json={"documents": [TEMPLATE]}, headers=BOB), 403, "forbidden")
    error(await http.delete("/v1/templates/basic", headers=BOB), 403, "forbidden")
    assert (await http.delete("/v1/templates/basic")).status_code == 204
    error(await http.get("/v1/templates/basic"), 404, "template_not_found")
    broken = await http.post("/v1/apply", json={"documents": [{"kind": "Nope"}]})
    error(broken, 400, "invalid_resource")


# -- auth -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("authorization", ["", "Bearer nope", "Basic alice-token", "Bearer", "Bearer bob-token x"])
async def test_a_missing_or_wrong_token_is_401(http: httpx.AsyncClient, authorization: str) -> None:
    error(await http.get("/v1/sandboxes", headers={"Authorization": authorization}), 401, "unauthorized")


async def test_another_tenants_sandbox_is_not_found_whatever_the_call(http: httpx.AsyncClient) -> None:
    mine = (await claim(http, template="t"))["id"]
    for method, path in [("GET", ""), ("DELETE", ""), ("GET", "/stats"), ("POST", "/reset"), ("POST", "/pause")]:
        error(await http.request(method, f"/v1/sandboxes/{mine}{path}", headers=BOB), 404, "sandbox_not_found")
    error(await http.post(f"/v1/sandboxes/{mine}/exec", json={"command": "id"}, headers=BOB), 404,
          "sandbox_not_found")
    assert (await http.get("/v1/sandboxes", headers=BOB)).json() == []
    assert (await http.get(f"/v1/sandboxes/{mine}")).status_code == 200


async def test_health_metrics_and_the_openapi_document_need_no_token(http: httpx.AsyncClient) -> None:
    anonymous = {"Authorization": ""}
    health = (await http.get("/healthz", headers=anonymous)).json()
    assert health["status"] == "ok" and health["max_sandboxes"] == 8
    assert (await http.get("/metrics", headers=anonymous)).headers["content-type"].startswith("text/plain")
    assert (await http.get("/openapi.json", headers=anonymous)).status_code == 200


async def test_an_open_server_has_one_tenant_which_is_its_admin(node: MemoryNode) -> None:
    async with client_of(create_app(node)) as http:  # type: ignore[arg-type]
        assert (await claim(http))["tenant"] == "default"
        assert (await http.post("/v1/apply", json={"documents": [TEMPLATE]})).status_code == 200


async def test_the_dashboard_learns_without_a_token_whether_it_needs_one(node: MemoryNode,
                                                                          http: httpx.AsyncClient) -> None:
    anonymous = {"Authorization": ""}
    assert (await http.get("/dashboard/api/access", headers=anonymous)).json() == {"token_required": True}
    error(await http.get("/dashboard/api/overview", headers=anonymous), 401, "unauthorized")
    async with client_of(create_app(node)) as open_server:  # type: ignore[arg-type]
        assert (await open_server.get("/dashboard/api/access")).json() == {"token_required": False}
        assert (await open_server.get("/dashboard/api/overview")).json()["admin"] is True


# -- bad requests and failures ----------------------------------------------------------------------

async def test_malformed_or_misspelt_bodies_are_422(http: httpx.AsyncClient) -> None:
    error(await http.post("/v1/sandboxes", content=b"{nope"), 422, "invalid_request")
    error(await http.post("/v1/sandboxes", content=b"[1, 2]"), 422, "invalid_request")
    error(await http.post("/v1/sandboxes", json={"warmpool": "p", "bogus": 1}), 422, "invalid_request")
    error(await http.post("/v1/sandboxes", json={"shutdown_after": "soon"}), 422, "invalid_request")
    sandbox = (await claim(http))["id"]
    error(await http.post(f"/v1/sandboxes/{sandbox}/exec", json={}), 422, "invalid_request")
    error(await http.post(f"/v1/sandboxes/{sandbox}/fork", json={"count": 1000}), 422, "invalid_request")


async def test_a_body_of_thousands_of_problems_is_told_in_a_few(http: httpx.AsyncClient) -> None:
    """An object of many unknown keys (50,000 fit in a body) answers its first problems and their count."""
    answer = await http.post("/v1/sandboxes", json={"warmpool": "p", "limits": {f"k{i}": 1 for i in range(80)}})
    error(answer, 422, "invalid_request")
    message = answer.json()["error"]["message"]
    assert message.startswith("invalid request: limits.k0: Extra inputs are not permitted; limits.k1: ")
    assert message.endswith("limits.k19: Extra inputs are not permitted; and 60 more") and len(message) < 2000
    few = await http.post("/v1/sandboxes", json={"warmpool": "p", "seed": -1, "limits": {"k": 1}})
    error(few, 422, "invalid_request",
          "invalid request: limits.k: Extra inputs are not permitted; seed: Input should be greater than or equal to 0")


async def test_bodies_over_the_limit_are_413_declared_or_streamed(http: httpx.AsyncClient) -> None:
    error(await http.post("/v1/sandboxes", content=b"x" * (MAX_BODY + 1)), 413, "too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * (MAX_BODY // 2)

    error(await http.post("/v1/sandboxes", content=chunks()), 413, "too_large")
    error(await http.post("/v1/sandboxes", content=b"{}", headers={"Content-Length": "two"}), 400, "invalid_request")
    assert (await http.post("/v1/sandboxes", content=b" " * (MAX_BODY - 2) + b"{}")).status_code == 201


async def test_a_node_failure_is_500_internal_and_counted(http: httpx.AsyncClient) -> None:
    error(await http.post("/v1/sandboxes", json={"template": FAILING_TEMPLATE}), 500, "internal",
          "the server failed: boom; see its log")
    metrics = (await http.get("/metrics")).text
    assert 'rollbox_failures_total{code="internal"} 1.0' in metrics
    assert 'rollbox_failures_total{code="not_found"}' not in metrics


async def test_metrics_count_claims(http: httpx.AsyncClient) -> None:
    for _ in range(3):
        await claim(http, warmpool="p")
    await http.get("/v1/nothing")
    metrics = (await http.get("/metrics")).text
    assert "rollbox_claims_total 3.0" in metrics
    assert "rollbox_claim_seconds_count 3.0" in metrics
    assert 'rollbox_failures_total{code="not_found"} 1.0' in metrics


# -- the OpenAPI document ---------------------------------------------------------------------------

async def test_the_openapi_document_describes_every_route_it_serves(http: httpx.AsyncClient) -> None:
    document = (await http.get("/openapi.json")).json()
    assert document["openapi"] == "3.1.0" and document["info"]["title"] == "rollbox"
    paths = document["paths"]
    assert {"/v1/sandboxes", "/v1/sandboxes/{sandbox_id}/exec", "/v1/apply", "/healthz"} <= set(paths)
    assert set(paths["/v1/sandboxes"]) == {"get", "post"}
    for path, operations in paths.items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method in operations:
            answer = await http.request(method.upper(), concrete, headers={"Authorization": "Bearer nope"})
            public = "security" not in operations[method]  # needs no token: may not know the name `x`
            assert answer.status_code in ((200, 404) if public and concrete != path else (200, 401)), (
                method, path, answer.text)
            assert "no such route" not in answer.text, (method, path)


PYDANTIC_ONLY = {"gt", "ge", "lt", "le", "multiple_of", "max_digits", "decimal_places", "allow_inf_nan"}
"""Constraint names pydantic writes into a schema when it cannot place them: no JSON Schema keyword."""


def keywords(schema: Any) -> Iterator[str]:
    """Every keyword a schema uses, at any depth (the names under `properties` are fields, not keywords)."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            yield key
            for child in value.values() if key in ("properties", "$defs") else [value]:
                yield from keywords(child)
    elif isinstance(schema, list):
        for item in schema:
            yield from keywords(item)


async def test_the_openapi_schemas_speak_json_schema(http: httpx.AsyncClient) -> None:
    schemas = (await http.get("/openapi.json")).json()["components"]["schemas"]
    assert {"anyOf", "exclusiveMinimum", "pattern"} <= set(keywords(list(schemas.values())))
    assert not PYDANTIC_ONLY & set(keywords(list(schemas.values())))


@pytest.mark.parametrize(("value", "taken"), [(300, True), (0.5, True), ("5m", True), ("250ms", True),
                                              (" 2h ", True), (0, False), (-1, False), ("soon", False),
                                              ("5 minutes", False)])
async def test_shutdown_after_is_documented_as_what_the_server_takes(http: httpx.AsyncClient, value: Any,
                                                                      taken: bool) -> None:
    """The document said `gt` (no JSON Schema keyword) and a number alone, while `5m` is taken: a client checking
    its request against the document now agrees with the server, for a claim and for a moved end alike."""
    schemas = (await http.get("/openapi.json")).json()["components"]["schemas"]
    sandbox = (await claim(http))["id"]
    for model, method, path, body in (
            ("ClaimRequest", "POST", "/v1/sandboxes", {"warmpool": "p", "shutdown_after": value}),
            ("ShutdownAfterRequest", "PUT", f"/v1/sandboxes/{sandbox}/shutdown_after", {"shutdown_after": value})):
        valid = Draft202012Validator(schemas[model]["properties"]["shutdown_after"]).is_valid(value)
        answer = await http.request(method, path, json=body)
        assert (valid, answer.status_code != 422) == (taken, taken), (model, value, answer.text)


# -- serving ----------------------------------------------------------------------------------------

def test_the_collector_is_settled_as_the_server_starts(node: MemoryNode) -> None:
    app = create_app(node)  # type: ignore[arg-type]
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
