"""bench/simulated_node.py, the cluster benchmark's stand-in for a node agent: behind the node agent's own API it
must answer where a router looks as a real node does (sandbox ids, health, room, warm pools and their labels), or
the router the benchmark measures would take other paths than in a real cluster."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from rollbox.server import create_app
from rollbox.server.auth import TENANT_HEADER
from rollbox.spec import parse_resource
from tests.unit.in_process import client_of

pytestmark = pytest.mark.anyio
SECRET = "a-cluster-secret-of-enough-characters"
LABELS = {"rollbox.io/cluster-replicas": "6", "team": "rl"}


def load_stand_in() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "simulated_node.py"
    spec = importlib.util.spec_from_file_location("simulated_node", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


simulated_node = load_stand_in()


def resource(kind: str, name: str, spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> Any:
    return parse_resource({"apiVersion": "rollbox.dev/v1alpha1", "kind": kind,
                           "metadata": {"name": name, "labels": labels or {}}, "spec": spec or {}})


@pytest.fixture
async def node() -> Any:
    """A simulated node of 3 sandboxes with a warm pool of 2, its labels those a router writes."""
    node = simulated_node.SimulatedNode("sim-07", 3)
    await node.apply(resource("SandboxTemplate", "t"), lambda message: None)
    await node.apply(resource("SandboxWarmPool", "p", {"replicas": 2, "sandboxTemplateRef": {"name": "t"}}, LABELS),
                     lambda message: None)
    return node


@pytest.fixture
async def http(node: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A router's client of the stand-in's API: the cluster secret, acting for tenant alice."""
    async with client_of(create_app(node, cluster_secret=SECRET), SECRET) as client:
        client.headers[TENANT_HEADER] = "alice"
        yield client


async def health(http: httpx.AsyncClient) -> dict[str, Any]:
    answer = await http.get("/healthz")
    assert answer.status_code == 200
    return answer.json()


async def test_health_reports_what_a_named_local_node_does(http: httpx.AsyncClient) -> None:
    assert await health(http) == {
        "status": "ok", "node": "sim-07", "sandboxes": 2, "max_sandboxes": 3, "claims": 0,
        "pools": {"p": {"template": "t", "replicas": 2, "ready": 2, "starting": 0, "refill_concurrency": 2,
                        "labels": LABELS}}}


async def test_claims_take_room_from_the_pool_until_the_node_is_full(http: httpx.AsyncClient) -> None:
    ids = []
    for ready in (2, 1, 0):
        answer = await http.post("/v1/sandboxes", json={"warmpool": "p"})
        assert answer.status_code == 201
        ids.append(answer.json()["id"])
        now = await health(http)
        assert (now["claims"], now["sandboxes"], now["pools"]["p"]["ready"]) == (len(ids), len(ids) + ready, ready)
    assert all(sandbox_id.startswith("sim-07-") and len(sandbox_id) == len("sim-07-") + 16 for sandbox_id in ids)
    full = await http.post("/v1/sandboxes", json={"warmpool": "p"})
    assert full.status_code == 429 and full.json()["error"]["code"] == "capacity_exceeded"
    assert (await http.delete(f"/v1/sandboxes/{ids[0]}")).status_code == 204
    assert (await health(http))["pools"]["p"]["ready"] == 1


async def test_sandboxes_are_the_tenants_and_the_api_the_routers(http: httpx.AsyncClient) -> None:
    sandbox_id = (await http.post("/v1/sandboxes", json={"warmpool": "p"})).json()["id"]
    bob = await http.get(f"/v1/sandboxes/{sandbox_id}", headers={TENANT_HEADER: "bob"})
    assert bob.status_code == 404
    stranger = await http.get(f"/v1/sandboxes/{sandbox_id}", headers={"Authorization": "Bearer not-the-secret"})
    assert stranger.status_code == 401
    assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["tenant"] == "alice"


async def test_commands_and_files_answer_alike_and_the_rest_says_it_is_not_simulated(http: httpx.AsyncClient) -> None:
    sandbox_id = (await http.post("/v1/sandboxes", json={"warmpool": "p"})).json()["id"]
    ran = await http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": "false"})
    assert ran.status_code == 200 and ran.json()["exit_code"] == 0
    written = await http.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/a"}, content=b"x")
    assert written.status_code == 204
    read = await http.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/a"})
    assert read.status_code == 404 and read.json()["error"]["code"] == "file_not_found"
    fork = await http.post(f"/v1/sandboxes/{sandbox_id}/fork", json={"count": 1})
    assert fork.status_code == 400 and "simulated" in fork.json()["error"]["message"]


async def test_a_pool_needs_its_template_and_applying_again_changes_nothing(node: Any) -> None:
    pool = resource("SandboxWarmPool", "p", {"replicas": 2, "sandboxTemplateRef": {"name": "t"}}, LABELS)
    assert await node.apply(pool, lambda message: None) == "unchanged"
    orphan = resource("SandboxWarmPool", "q", {"replicas": 1, "sandboxTemplateRef": {"name": "missing"}})
    with pytest.raises(simulated_node.TemplateNotFound):
        await node.apply(orphan, lambda message: None)
