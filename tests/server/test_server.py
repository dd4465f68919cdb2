"""The HTTP API against a real server process (`rollbox.server.serve`) on loopback, with plain httpx."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox.engine import Engine
from tests.support.engines import BASIC, teardown_engine
from tests.support.servers import wait_until_serving

TOKENS = {"alice": "alice-token", "bob": "bob-token", "carol": "carol-token"}
TEMPLATE = {"apiVersion": "rollbox.dev/v1alpha1", "kind": "SandboxTemplate", **BASIC}


def warm_pool(replicas: int, name: str = "basic-pool") -> dict[str, Any]:
    return {"kind": "SandboxWarmPool", "metadata": {"name": name},
            "spec": {"replicas": replicas, "refillConcurrency": 4, "sandboxTemplateRef": {"name": "basic"}}}


class Server:
    """`serve()` in a child process, so a test can kill it like a crash would."""

    def __init__(self, data_dir: Path, **options: Any) -> None:
        self.data_dir = data_dir
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.options = {"data_dir": str(data_dir), "port": self.port, **options}
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        code = "import json, sys; from rollbox.server import serve; serve(**json.loads(sys.argv[1]))"
        self.process = subprocess.Popen([sys.executable, "-c", code, json.dumps(self.options)])
        wait_until_serving(self.url, self.process)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(30)
        if sig == signal.SIGTERM:
            assert code == 0, f"serve() must shut down cleanly on SIGTERM (exit {code})"

    def client(self, tenant: str | None = "alice") -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}"} if tenant and "tokens" in self.options else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def cleanup(self) -> None:
        """Stops the server and removes every sandbox, mount and cgroup it made."""
        if self.process is not None and self.process.poll() is None:
            self.stop()
        teardown_engine(Engine(self.data_dir))


@pytest.fixture
def make_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    servers: list[Server] = []

    def make(**options: Any) -> Server:
        server = Server(tmp_path_factory.mktemp("server"), **options)
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.cleanup()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for most tests: three tenants (alice the admin), a quota of 80 each, bodies up to 1 MiB."""
    server = Server(tmp_path_factory.mktemp("server"), tokens=TOKENS, admins=["alice"], max_sandboxes=160,
                    tenant_quota=80, max_body=2**20)
    server.start()
    with server.client() as http:
        events = apply(http, [TEMPLATE, warm_pool(4)])
        assert [e["status"] for e in events if e["event"] == "applied"] == ["created", "created"]
    yield server
    server.cleanup()


@pytest.fixture
def alice(server: Server) -> Iterator[httpx.Client]:
    with server.client("alice") as http:
        yield http
        for sandbox in http.get("/v1/sandboxes").json():
            http.delete(f"/v1/sandboxes/{sandbox['id']}")


@pytest.fixture
def bob(server: Server) -> Iterator[httpx.Client]:
    with server.client("bob") as http:
        yield http


def apply(http: httpx.Client, documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = http.post("/v1/apply", json={"documents": documents})
    assert response.status_code == 200, response.text
    events = [json.loads(line) for line in response.text.splitlines()]
    assert events[-1] == {"event": "done"}, events
    return events


def claim(http: httpx.Client, **body: Any) -> dict[str, Any]:
    """Claims a sandbox, from the warm pool unless the body names a source."""
    if not {"template", "warmpool", "snapshot"} & body.keys():
        body["warmpool"] = "basic-pool"
    response = http.post("/v1/sandboxes", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def run(http: httpx.Client, sandbox_id: str, command: str | list[str], **options: Any) -> dict[str, Any]:
    response = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": command, **options})
    assert response.status_code == 200, response.text
    return response.json()


def error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text
    assert response.json()["error"]["message"]


def wait_ready(http: httpx.Client, pool: str = "basic-pool", timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (info := http.get(f"/v1/warmpools/{pool}").json())["ready"] < info["replicas"]:
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


# -- resources and claims -----------------------------------------------------------------------

def test_apply_is_idempotent_and_lists_resources(alice: httpx.Client) -> None:
    events = apply(alice, [TEMPLATE, warm_pool(4)])
    assert [e["status"] for e in events if e["event"] == "applied"] == ["unchanged", "unchanged"]
    assert [t["name"] for t in alice.get("/v1/templates").json()] == ["basic"]
    assert alice.get("/v1/templates/basic").json()["spec"]["steps"]
    assert alice.get("/v1/warmpools/basic-pool").json()["template"] == "basic"
    events = apply(alice, [warm_pool(1, "broken") | {"spec": {"replicas": 1, "sandboxTemplateRef": {"name": "no"}}}])
    assert events[-2]["event"] == "error" and events[-2]["code"] == "template_not_found"
    error(alice.get("/v1/templates/nope"), 404, "template_not_found")


def test_a_warm_pool_that_can_never_fill_is_refused(alice: httpx.Client) -> None:
    [*_, refused, _] = apply(alice, [warm_pool(157, "huge")])  # basic-pool keeps 4 of the node's 160
    assert (refused["event"], refused["code"]) == ("error", "invalid_resource"), refused
    assert "basic-pool (4) keep 4 ready: lower replicas to 156 or fewer" in refused["message"]
    error(alice.get("/v1/warmpools/huge"), 404, "not_found")


def test_claim_from_a_warm_pool_then_exec(alice: httpx.Client) -> None:
    wait_ready(alice)
    started = time.perf_counter()
    sandbox = claim(alice, warmpool="basic-pool", labels={"run": "1"}, env={"GREETING": "hi"})
    assert time.perf_counter() - started < 0.5
    assert {k: sandbox[k] for k in ("template", "warmpool", "tenant", "state", "labels")} == {
        "template": "basic", "warmpool": "basic-pool", "tenant": "alice", "state": "running", "labels": {"run": "1"}}
    result = run(alice, sandbox["id"], "cat /opt/data/file; echo $GREETING; exit 3")
    assert (result["exit_code"], result["stdout"]) == (3, "baseline\nhi\n")
    assert run(alice, sandbox["id"], ["echo", "$HOME"])["stdout"] == "$HOME\n"
    slow = run(alice, sandbox["id"], "sleep 5", timeout=0.3)
    assert slow["timed_out"] and slow["exit_code"] is None
    assert alice.get(f"/v1/sandboxes/{sandbox['id']}").json() == sandbox
    assert [s["id"] for s in alice.get("/v1/sandboxes").json()] == [sandbox["id"]]
    assert alice.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
    error(alice.get(f"/v1/sandboxes/{sandbox['id']}"), 404, "sandbox_not_found")
    error(alice.post(f"/v1/sandboxes/{sandbox['id']}/exec", json={"command": "true"}), 404, "sandbox_not_found")


def test_exec_streams_output_as_it_comes(alice: httpx.Client) -> None:
    sandbox = claim(alice)
    body = {"command": "echo one; sleep 0.3; echo two >&2; echo three"}
    arrivals = []
    with alice.stream("POST", f"/v1/sandboxes/{sandbox['id']}/exec/stream", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        for line in response.iter_lines():
            arrivals.append((time.monotonic(), json.loads(line)))
    events = [event for _, event in arrivals]
    assert events[0] == {"type": "stdout", "data": "one\n"}
    assert arrivals[1][0] - arrivals[0][0] > 0.2  # streamed, not buffered
    assert {"type": "stderr", "data": "two\n"} in events
    assert events[-1]["type"] == "result"
    assert events[-1]["result"]["stdout"] == "one\nthree\n" and events[-1]["result"]["exit_code"] == 0
    error(alice.post("/v1/sandboxes/nope/exec/stream", json=body), 404, "sandbox_not_found")
    started = time.monotonic()
    with alice.stream("POST", f"/v1/sandboxes/{sandbox['id']}/exec/stream", json={"command": "sleep 6"}) as response:
        assert time.monotonic() - started < 5  # a silent command's answer starts before the command ends
        assert json.loads(response.read())["result"]["exit_code"] == 0


def test_files(alice: httpx.Client) -> None:
    sandbox_id = claim(alice)["id"]
    files = f"/v1/sandboxes/{sandbox_id}/files"
    assert alice.put(files, params={"path": "app/calc.py", "mode": 0o755}, content=b"print(1)\n").status_code == 204
    assert alice.get(files, params={"path": "app/calc.py"}).content == b"print(1)\n"
    stat = alice.get(f"{files}/stat", params={"path": "app/calc.py"}).json()
    assert (stat["type"], stat["size"], stat["mode"] & 0o777) == ("file", 9, 0o755)
    assert run(alice, sandbox_id, "python3 app/calc.py || cat app/calc.py")["exit_code"] == 0
    assert alice.post(f"{files}/mkdir", params={"path": "/tmp/a/b"}).status_code == 204
    assert [f["name"] for f in alice.get(f"{files}/list", params={"path": "app"}).json()] == ["calc.py"]
    archive = alice.get(f"{files}/archive", params={"path": "app"})
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        assert "calc.py" in " ".join(tar.getnames())
    upload = alice.put(f"{files}/archive", params={"path": "/tmp/a/b"}, content=_tar({"x.txt": b"x", "d/y.txt": b"y"}))
    assert upload.status_code == 200 and upload.json()["entries"] >= 2
    assert run(alice, sandbox_id, "cat /tmp/a/b/x.txt /tmp/a/b/d/y.txt")["stdout"] == "xy"
    assert alice.delete(files, params={"path": "/tmp/a", "recursive": True}).status_code == 204
    error(alice.get(f"{files}/stat", params={"path": "/tmp/a"}), 404, "file_not_found")
    error(alice.get(files, params={"path": ""}), 400, "invalid_path")
    assert alice.get(files, params={"path": "../../../../etc/hostname"}).status_code in (200, 404)  # stays inside


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_reset_keeps_the_id_and_restores_the_baseline(alice: httpx.Client) -> None:
    sandbox = claim(alice)
    run(alice, sandbox["id"], "touch ~/episode-junk")
    wait_ready(alice)
    again = alice.post(f"/v1/sandboxes/{sandbox['id']}/reset")  # its latency is measured by bench/server.py
    assert again.status_code == 200 and again.json()["id"] == sandbox["id"]
    assert run(alice, sandbox["id"], "ls ~; cat /opt/data/file")["stdout"] == "baseline\n"


def test_fork_makes_new_sandboxes_from_the_same_state(alice: httpx.Client) -> None:
    parent = claim(alice)
    run(alice, parent["id"], "echo 41 > ~/answer")
    children = alice.post(f"/v1/sandboxes/{parent['id']}/fork", json={"count": 3})
    assert children.status_code == 200, children.text
    ids = [child["id"] for child in children.json()]
    assert len(set(ids)) == 3 and parent["id"] not in ids
    for child_id in ids:
        assert run(alice, child_id, "cat ~/answer")["stdout"] == "41\n"
        assert alice.get(f"/v1/sandboxes/{child_id}").json()["parent"] == parent["id"]
    error(alice.post(f"/v1/sandboxes/{parent['id']}/fork", json={"count": 0}), 422, "invalid_request")


def test_snapshots(alice: httpx.Client, bob: httpx.Client) -> None:
    sandbox = claim(alice)
    run(alice, sandbox["id"], "echo kept > ~/kept")
    snapshot = alice.post(f"/v1/sandboxes/{sandbox['id']}/snapshot", json={"name": "solved"})
    assert snapshot.status_code == 200, snapshot.text
    assert snapshot.json()["name"] == "solved" and snapshot.json()["source"] == sandbox["id"]
    assert [s["name"] for s in alice.get("/v1/snapshots").json()] == ["solved"]
    assert bob.get("/v1/snapshots").json() == []
    restored = claim(alice, snapshot="solved")
    assert run(alice, restored["id"], "cat ~/kept")["stdout"] == "kept\n"
    error(bob.post("/v1/sandboxes", json={"snapshot": "solved"}), 404, "snapshot_not_found")
    error(bob.delete("/v1/snapshots/solved"), 404, "snapshot_not_found")
    error(alice.post(f"/v1/sandboxes/{sandbox['id']}/snapshot", json={"name": "Bad Name"}), 400, "invalid_request")
    assert alice.delete("/v1/snapshots/solved").status_code == 204
    assert alice.get("/v1/snapshots").json() == []


def test_pause_resume_and_idle_pause(alice: httpx.Client) -> None:
    sandbox = claim(alice)
    paused = alice.post(f"/v1/sandboxes/{sandbox['id']}/pause")
    assert paused.json()["state"] == "paused"
    error(alice.post(f"/v1/sandboxes/{sandbox['id']}/exec", json={"command": "true"}), 409, "sandbox_not_running")
    assert alice.post(f"/v1/sandboxes/{sandbox['id']}/resume").json()["state"] == "running"
    assert run(alice, sandbox["id"], "echo up")["stdout"] == "up\n"

    idle = claim(alice, warmpool="basic-pool", idle_pause_after=0.5)
    run(alice, idle["id"], "echo state > ~/state")
    deadline = time.monotonic() + 10
    while alice.get(f"/v1/sandboxes/{idle['id']}").json()["state"] != "paused":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert run(alice, idle["id"], "cat ~/state")["stdout"] == "state\n"  # woken transparently
    assert alice.get(f"/v1/sandboxes/{idle['id']}").json()["state"] == "running"


def test_sandboxes_expire(alice: httpx.Client) -> None:
    sandbox = claim(alice, shutdown_after="1s")
    assert sandbox["expires_at"] == pytest.approx(sandbox["created_at"] + 1)
    deadline = time.monotonic() + 10
    while alice.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    error(alice.get(f"/v1/sandboxes/{sandbox['id']}"), 404, "sandbox_not_found")


# -- tenants, limits and bad input --------------------------------------------------------------

def test_tenants_cannot_see_or_touch_each_other(server: Server, alice: httpx.Client, bob: httpx.Client) -> None:
    mine = claim(alice)["id"]
    calls = [("GET", f"/v1/sandboxes/{mine}", None), ("DELETE", f"/v1/sandboxes/{mine}", None),
             ("POST", f"/v1/sandboxes/{mine}/exec", {"command": "true"}), ("POST", f"/v1/sandboxes/{mine}/reset", None),
             ("POST", f"/v1/sandboxes/{mine}/fork", {"count": 1}), ("POST", f"/v1/sandboxes/{mine}/pause", None),
             ("GET", f"/v1/sandboxes/{mine}/files?path=/etc/hostname", None)]
    for method, path, body in calls:
        error(bob.request(method, path, json=body), 404, "sandbox_not_found")
    assert bob.get("/v1/sandboxes").json() == []
    assert run(alice, mine, "true")["exit_code"] == 0
    with server.client(None) as anonymous:
        error(anonymous.get("/v1/sandboxes"), 401, "unauthorized")
        error(anonymous.get("/v1/sandboxes", headers={"Authorization": "Bearer wrong"}), 401, "unauthorized")
        assert anonymous.get("/healthz").json()["status"] == "ok"


def test_only_admins_change_templates_and_pools(server: Server, alice: httpx.Client, bob: httpx.Client,
                                                tmp_path: Path) -> None:
    """A template decides what every sandbox made from it runs, and its `copy` steps read the server's own
    files: a tenant allowed to apply one could plant code in other tenants' sandboxes or read the host."""
    secret = tmp_path / "host-secret"
    secret.write_text("the server's secret\n")
    steal = {**TEMPLATE, "metadata": {"name": "steal"},
             "spec": {"steps": [{"copy": {"src": secret.name, "dest": "/tmp/secret"}}]}}
    plant = {**TEMPLATE, "spec": {"steps": [{"run": "echo planted > /opt/planted"}]}}
    def resources(client: httpx.Client) -> tuple[object, object]:
        """What apply and delete change; a pool's ready and starting counts move as it refills on its own."""
        pools = [{key: pool[key] for key in ("name", "template", "replicas", "max_replicas")}
                 for pool in client.get("/v1/warmpools").json()]
        return client.get("/v1/templates").json(), pools

    before = resources(alice)
    for documents in ([steal], [plant], [warm_pool(0)]):
        answer = bob.post("/v1/apply", json={"documents": documents, "context_dir": str(tmp_path)})
        error(answer, 403, "forbidden")
        assert "admin" in answer.json()["error"]["message"]
    error(bob.delete("/v1/warmpools/basic-pool"), 403, "forbidden")
    error(bob.delete("/v1/templates/basic"), 403, "forbidden")
    assert resources(bob) == before
    mine = claim(bob)["id"]
    assert run(bob, mine, "test -e /opt/planted || test -e /tmp/secret || echo clean")["stdout"] == "clean\n"
    bob.delete(f"/v1/sandboxes/{mine}")

    # An admin (the operator) builds from the server's own files on purpose.
    answer = alice.post("/v1/apply", json={"documents": [steal], "context_dir": str(tmp_path)})
    assert '"status":"created"' in answer.text.replace(" ", ""), answer.text
    alice.delete("/v1/templates/steal").raise_for_status()


def test_bad_input_is_a_4xx_and_the_server_keeps_serving(alice: httpx.Client) -> None:
    sandbox_id = claim(alice)["id"]
    exec_path = f"/v1/sandboxes/{sandbox_id}/exec"
    error(alice.post("/v1/sandboxes", json={"template": "nope"}), 404, "template_not_found")
    error(alice.post("/v1/sandboxes", json={"warmpool": "nope"}), 404, "not_found")
    error(alice.post("/v1/sandboxes", json={}), 400, "invalid_request")
    error(alice.post("/v1/sandboxes", json={"template": "basic", "shutdown_after": "soon"}), 422, "invalid_request")
    error(alice.post(exec_path, content=b"{not json", headers={"content-type": "application/json"}), 422,
          "invalid_request")
    error(alice.post(exec_path, json={}), 422, "invalid_request")
    error(alice.post(exec_path, json={"command": "true", "bogus": 1}), 422, "invalid_request")
    error(alice.post(exec_path, json={"command": []}), 400, "invalid_request")
    error(alice.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "big"}, content=b"x" * (2**20 + 1)),
          413, "too_large")
    error(alice.post("/v1/apply", json={"documents": [{"kind": "Nope"}]}), 400, "invalid_resource")
    error(alice.get(f"/v1/sandboxes/{sandbox_id}/files"), 422, "invalid_request")
    error(alice.get("/v1/nothing-here"), 404, "not_found")
    error(alice.delete("/v1/templates/nope"), 404, "template_not_found")
    error(alice.delete("/v1/templates/basic"), 409, "conflict")
    assert run(alice, sandbox_id, "echo still here")["stdout"] == "still here\n"
    assert "rollbox_failures_total" in alice.get("/metrics").text


def test_quota_per_tenant(server: Server) -> None:
    with server.client("carol") as carol:
        held = [claim(carol, template="basic")["id"] for _ in range(80)]
        error(carol.post("/v1/sandboxes", json={"template": "basic"}), 429, "capacity_exceeded")
        carol.delete(f"/v1/sandboxes/{held.pop()}")
        held.append(claim(carol, template="basic")["id"])
        for sandbox_id in held:
            carol.delete(f"/v1/sandboxes/{sandbox_id}")


def test_full_node_answers_429_at_once(make_server: Any) -> None:
    small = make_server(max_sandboxes=2)
    with small.client() as http:
        apply(http, [TEMPLATE])
        claim(http, template="basic")
        claim(http, template="basic")
        started = time.perf_counter()
        error(http.post("/v1/sandboxes", json={"template": "basic"}), 429, "capacity_exceeded")
        assert time.perf_counter() - started < 1


@pytest.mark.slow
def test_64_clients_make_500_claims_and_lose_none(server: Server) -> None:
    with server.client() as http:
        wait_ready(http)
    headers = {"Authorization": f"Bearer {TOKENS['bob']}"}

    async def main() -> list[str]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, headers=headers, limits=limits, timeout=60) as http:
            remaining = iter(range(500))
            claimed: list[str] = []

            async def client() -> None:
                for _ in remaining:
                    response = await http.post("/v1/sandboxes", json={"warmpool": "basic-pool"})
                    assert response.status_code == 201, response.text
                    sandbox_id = response.json()["id"]
                    claimed.append(sandbox_id)
                    assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).status_code == 200
                    assert (await http.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 204

            await asyncio.gather(*(client() for _ in range(64)))
            return claimed

    claimed = asyncio.run(main())
    assert len(claimed) == 500 and len(set(claimed)) == 500
    with server.client("bob") as http:
        assert http.get("/v1/sandboxes").json() == []
        metrics = http.get("/metrics").text
        assert "rollbox_claims_total" in metrics and "rollbox_pool_ready" in metrics


# -- durability ---------------------------------------------------------------------------------

def test_a_server_killed_with_sigkill_keeps_every_claim(make_server: Any) -> None:
    server = make_server(max_sandboxes=16)
    with server.client() as http:
        apply(http, [TEMPLATE, warm_pool(2)])
        wait_ready(http)
        sandboxes = [claim(http) for _ in range(3)]
        sandboxes.append(claim(http, template="basic", idle_pause_after=0.3))
        deleted = claim(http)["id"]
        assert http.delete(f"/v1/sandboxes/{deleted}").status_code == 204  # a deletion is kept as a claim is
        for index, sandbox in enumerate(sandboxes):
            run(http, sandbox["id"], f"echo {index} > ~/mark")
        http.post(f"/v1/sandboxes/{sandboxes[0]['id']}/pause")
        time.sleep(1)
        assert http.get(f"/v1/sandboxes/{sandboxes[3]['id']}").json()["state"] == "paused"
        wait_ready(http)
    server.stop(signal.SIGKILL)
    server.start()
    with server.client() as http:
        assert sorted(s["id"] for s in http.get("/v1/sandboxes").json()) == sorted(s["id"] for s in sandboxes)
        http.post(f"/v1/sandboxes/{sandboxes[0]['id']}/resume")
        for index, sandbox in enumerate(sandboxes):
            assert run(http, sandbox["id"], "cat ~/mark")["stdout"] == f"{index}\n"
        http.post(f"/v1/sandboxes/{sandboxes[1]['id']}/reset")
        assert run(http, sandboxes[1]["id"], "ls ~")["stdout"] == ""
        deadline = time.monotonic() + 10
        while http.get("/healthz").json()["sandboxes"] != 6:  # 4 claims, 2 warm; the reset's old one goes
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_openapi_and_health(server: Server) -> None:
    document = httpx.get(f"{server.url}/openapi.json").json()
    assert "/v1/sandboxes/{sandbox_id}/exec" in document["paths"]
    health = httpx.get(f"{server.url}/healthz").json()
    assert health["status"] == "ok" and "basic-pool" in health["pools"] and health["max_sandboxes"] == 160


def test_no_tokens_means_loopback_only(tmp_path: Path) -> None:
    from rollbox.errors import InvalidRequest
    from rollbox.server import serve

    with pytest.raises(InvalidRequest, match="tokens"):
        serve(tmp_path, host="0.0.0.0")
    with pytest.raises(InvalidRequest, match="admin 'mallory' has no token"):
        serve(tmp_path, tokens=TOKENS, admins=["mallory"])
    with pytest.raises(InvalidRequest, match="admins need tokens"):
        serve(tmp_path, admins=["alice"])
    assert not os.listdir(tmp_path)
