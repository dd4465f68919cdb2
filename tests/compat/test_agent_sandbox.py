"""agent-sandbox's own Python client (`k8s-agent-sandbox`), unmodified, against a real `rollbox serve`.

Written as a user of that client writes it: a kubeconfig from `rollbox kubeconfig`, a direct connection to the
router, `create_sandbox(warmpool=...)`, commands, files; then what goes wrong (an unknown warm pool, a deleted
sandbox, another tenant's claim, timeouts) raised as the client's own exceptions.
"""

from __future__ import annotations

import contextlib
import io
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from k8s_agent_sandbox import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxWarmPoolNotFoundError,
)
from k8s_agent_sandbox.k8s_helper import K8sHelper
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from kubernetes import client as kube
from kubernetes import config, watch
from kubernetes_asyncio import config as async_config

from rollbox.engine import Engine
from tests.support.engines import teardown_engine
from tests.support.servers import wait_until_serving

ROLLBOX = Path(sys.executable).parent / "rollbox"
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}
POOL = """\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: python-sandbox-template}
spec:
  podTemplate:
    spec:
      containers:
      - name: python-runtime
        image: host
        ports: [{containerPort: 8888}]
        workingDir: /tmp
        env: [{name: FLAVOUR, value: rollbox}]
        resources: {limits: {cpu: 500m, memory: 256Mi}}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: python-pool}
spec:
  replicas: 2
  sandboxTemplateRef: {name: python-sandbox-template}
"""
"""agent-sandbox's own manifests, as its users have them; `rollbox apply -f` takes them."""


class Router:
    """`rollbox serve` on a loopback port, with a kubeconfig for each tenant."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        tokens = [arg for tenant, token in TOKENS.items() for arg in ("--token", f"{tenant}={token}")]
        self.process = subprocess.Popen([str(ROLLBOX), "serve", "--data-dir", str(root / "data"), "--port", str(port),
                                         *tokens, "--admin", "alice", "--delete-on-exit"])
        wait_until_serving(self.url, self.process)

    def kubeconfig(self, tenant: str) -> str:
        path = self.root / f"kubeconfig-{tenant}"
        subprocess.run([str(ROLLBOX), "kubeconfig", "--url", self.url, "--token", TOKENS[tenant], "-o", str(path)],
                       check=True, capture_output=True)
        return str(path)

    def connection(self, tenant: str) -> SandboxDirectConnectionConfig:
        return SandboxDirectConnectionConfig(api_url=self.url,
                                             extra_headers={"Authorization": f"Bearer {TOKENS[tenant]}"})

    def client(self, tenant: str) -> SandboxClient:
        """The client as a user makes it: the kubeconfig (or $KUBECONFIG), and the router's URL."""
        return SandboxClient(connection_config=self.connection(tenant),
                             api_client=config.new_client_from_config(self.kubeconfig(tenant)))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)
        teardown_engine(Engine(self.root / "data"))


@contextlib.contextmanager
def pooled_router(root: Path) -> Iterator[Router]:
    """A router with the `python-pool` warm pool applied, stopped on leaving."""
    server = Router(root)
    try:
        (server.root / "pool.yaml").write_text(POOL)
        subprocess.run([str(ROLLBOX), "apply", "-f", str(server.root / "pool.yaml"), "--url", server.url,
                        "--token", TOKENS["alice"]], check=True, capture_output=True)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with pooled_router(tmp_path_factory.mktemp("agent-sandbox")) as server:
        yield server


@pytest.fixture
def alice(router: Router) -> Iterator[SandboxClient]:
    with router.client("alice") as client:
        yield client


def test_a_warm_sandbox_runs_commands_and_files(router: Router, alice: SandboxClient) -> None:
    sandbox = alice.create_sandbox(warmpool="python-pool", labels={"team": "rl"}, shutdown_after_seconds=600,
                                   env={"GREETING": "hello"})
    assert sandbox.claim_name.startswith("sandbox-claim-") and sandbox.sandbox_id != sandbox.claim_name

    result = sandbox.commands.run("echo $GREETING $FLAVOUR; pwd; echo oops >&2; exit 3", timeout=5)
    assert (result.stdout, result.stderr, result.exit_code) == ("hello rollbox\n/tmp\n", "oops\n", 3)

    sandbox.files.write("work/notes.txt", "line one\n")
    sandbox.files.write("work/blob.bin", bytes(range(256)) * 4)
    assert sandbox.files.read("work/notes.txt") == b"line one\n"
    assert sandbox.files.read("work/blob.bin") == bytes(range(256)) * 4
    assert {(entry.name, entry.type, entry.size) for entry in sandbox.files.list("work")} == {
        ("notes.txt", "file", 9), ("blob.bin", "file", 1024)}
    assert sandbox.files.exists("work/notes.txt") and not sandbox.files.exists("work/missing.txt")
    assert sandbox.commands.run("cat work/notes.txt").stdout == "line one\n"

    again = alice.get_sandbox(sandbox.claim_name)
    assert again is sandbox
    assert sandbox.claim_name in alice.list_all_sandboxes(label_selector="team=rl")
    assert sandbox.claim_name not in alice.list_all_sandboxes(label_selector="team=other")
    assert sandbox.status()[0] == "SandboxReady"

    alice.delete_sandbox(sandbox.claim_name)
    assert sandbox.claim_name not in alice.list_all_sandboxes()
    with pytest.raises(SandboxNotFoundError):
        alice.get_sandbox(sandbox.claim_name, resolve_timeout=2)


def test_a_named_claim_is_adopted_and_kept_apart_from_its_sandbox_id(alice: SandboxClient) -> None:
    sandbox = alice.create_sandbox(warmpool="python-pool", claim_name="my-claim")
    again = alice.create_sandbox(warmpool="python-pool", claim_name="my-claim", adopt_existing=True)
    assert (sandbox.claim_name, again.sandbox_id) == ("my-claim", sandbox.sandbox_id)
    assert sandbox.sandbox_id != "my-claim"
    sandbox.files.write("big.bin", b"x" * 300_000)
    sink = io.BytesIO()
    assert sandbox.files.read_to("big.bin", sink) == 300_000 and sink.getvalue() == b"x" * 300_000
    with pytest.raises(NotImplementedError):
        sandbox.files.delete("big.bin")  # the client's own refusal: its router mode speaks the python runtime's API
    alice.delete_sandbox("my-claim")


def test_sandboxd_files_api_through_the_router(router: Router, alice: SandboxClient) -> None:
    """`/v1/files/...`, for the client versions that send sandboxd's file calls through the router."""
    sandbox = alice.create_sandbox(warmpool="python-pool")
    headers = {"Authorization": f"Bearer {TOKENS['alice']}", "X-Sandbox-ID": sandbox.sandbox_id,
               "X-Sandbox-Namespace": "default", "X-Sandbox-Port": "8888"}
    with httpx.Client(base_url=router.url, headers=headers) as http:
        assert http.put("/v1/files/d%2Fa.txt", content=b"sandboxd").status_code == 204
        assert http.get("/v1/files/d%2Fa.txt").content == b"sandboxd"
        assert http.head("/v1/files/d%2Fa.txt").status_code == 200
        listing = http.get("/v1/files/d").json()
        assert [(e["name"], e["type"], e["size"]) for e in listing["entries"]] == [("a.txt", "file", 8)]
        assert http.delete("/v1/files/d?recursive=true").status_code == 204
        assert http.head("/v1/files/d%2Fa.txt").status_code == 404
        assert http.post("/execute", json={"command": "true"}, headers={"X-Sandbox-ID": "x/y"}).status_code == 400
        assert http.post("/execute", content=b"{", headers={}).json()["detail"].startswith("the body is not JSON")
        assert http.post("/execute", json={"command": "true"},
                         headers={"X-Sandbox-Namespace": "elsewhere"}).status_code == 404
    alice.delete_sandbox(sandbox.claim_name)


def test_the_kubernetes_api_answers_statuses_and_stays_out_of_rollboxs_document(router: Router) -> None:
    claims = f"{router.url}/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims"
    anonymous = httpx.get(claims)
    assert (anonymous.status_code, anonymous.json()["kind"], anonymous.json()["reason"]) == (401, "Status",
                                                                                             "Unauthorized")
    alice = {"Authorization": f"Bearer {TOKENS['alice']}"}
    other = httpx.get(f"{router.url}/apis/apps/v1/namespaces/default/deployments", headers=alice)
    assert (other.status_code, other.json()["reason"]) == (404, "NotFound")
    bad = httpx.get(claims, params={"labelSelector": "a in b"}, headers=alice)
    assert (bad.status_code, bad.json()["reason"]) == (400, "BadRequest")
    groups = httpx.get(f"{router.url}/apis", headers=alice).json()
    assert {group["name"] for group in groups["groups"]} == {"agents.x-k8s.io", "extensions.agents.x-k8s.io"}
    assert not [path for path in httpx.get(f"{router.url}/openapi.json").json()["paths"] if path.startswith("/api")]


def test_the_data_plane_needs_a_token(router: Router, alice: SandboxClient) -> None:
    sandbox = alice.create_sandbox(warmpool="python-pool")
    anonymous = SandboxClient(connection_config=SandboxDirectConnectionConfig(api_url=router.url),
                              api_client=config.new_client_from_config(router.kubeconfig("alice")))
    with pytest.raises(SandboxRequestError) as raised:
        anonymous.get_sandbox(sandbox.claim_name).commands.run("true")
    assert raised.value.status_code == 401
    alice.delete_sandbox(sandbox.claim_name)


def test_command_timeouts_kill_the_command(alice: SandboxClient) -> None:
    sandbox = alice.create_sandbox(warmpool="python-pool")
    result = sandbox.commands.run("echo started; sleep 30", command_timeout=0.5)
    assert result.timed_out and result.exit_code == 124
    with pytest.raises(SandboxRequestError) as raised:
        sandbox.commands.run("sleep 30", timeout=1)
    assert raised.value.status_code == 504
    assert sandbox.commands.run("echo still here", timeout=5).stdout == "still here\n"
    alice.delete_all()
    assert alice.list_active_sandboxes() == []


def test_an_unknown_warm_pool_raises_the_clients_error(alice: SandboxClient) -> None:
    before = alice.list_all_sandboxes()
    with pytest.raises(SandboxWarmPoolNotFoundError, match="no-such-pool"):
        alice.create_sandbox(warmpool="no-such-pool", sandbox_ready_timeout=5)
    assert alice.list_all_sandboxes() == before  # the client deleted the failed claim


def test_a_deleted_sandbox_answers_not_found(router: Router, alice: SandboxClient) -> None:
    sandbox = alice.create_sandbox(warmpool="python-pool")
    other = router.client("alice")
    stale = other.get_sandbox(sandbox.claim_name)
    alice.delete_sandbox(sandbox.claim_name)
    with pytest.raises(SandboxRequestError) as raised:
        stale.commands.run("true")
    assert raised.value.status_code == 404
    with pytest.raises(SandboxRequestError) as raised:
        stale.files.read("anything")
    assert raised.value.status_code == 404


def test_tenants_never_see_each_others_claims(router: Router, alice: SandboxClient) -> None:
    sandbox = alice.create_sandbox(warmpool="python-pool")
    bob = router.client("bob")
    assert sandbox.claim_name not in bob.list_all_sandboxes()
    with pytest.raises(SandboxNotFoundError):
        bob.get_sandbox(sandbox.claim_name, resolve_timeout=2)
    forged = bob.sandbox_class(
        claim_name=sandbox.claim_name, sandbox_id=sandbox.sandbox_id, connection_config=router.connection("bob"),
        k8s_helper=bob.k8s_helper)
    with pytest.raises(SandboxRequestError) as raised:
        forged.commands.run("true")
    assert raised.value.status_code == 404
    bob.delete_sandbox(sandbox.claim_name)  # a claim bob cannot see: nothing happens to it
    assert sandbox.commands.run("echo mine").stdout == "mine\n"
    alice.delete_sandbox(sandbox.claim_name)


def test_a_watch_from_a_compacted_version_restarts(router: Router, alice: SandboxClient) -> None:
    """The Kubernetes side directly: 410 Gone for a version from before the server started, as an ERROR event;
    the client's own wait restarts from "0" and finds the claim."""
    sandbox = alice.create_sandbox(warmpool="python-pool")
    api_client = config.new_client_from_config(router.kubeconfig("alice"))
    api = kube.CustomObjectsApi(api_client)
    with pytest.raises(kube.ApiException) as gone:
        for _ in watch.Watch().stream(api.list_namespaced_custom_object, "extensions.agents.x-k8s.io", "v1beta1",
                                      "default", "sandboxclaims", resource_version="2", timeout_seconds=2):
            pass
    assert gone.value.status == 410
    helper = K8sHelper(api_client)
    assert helper.wait_for_claim_ready(sandbox.claim_name, "default", 10, resource_version="2") == sandbox.sandbox_id
    claim = api.get_namespaced_custom_object("extensions.agents.x-k8s.io", "v1beta1", "default", "sandboxclaims",
                                             sandbox.claim_name)
    assert claim["status"]["sandbox"]["name"] == sandbox.sandbox_id
    assert claim["metadata"]["labels"]["agents.x-k8s.io/created-by"] == "python-client"
    listed = api.list_namespaced_custom_object("extensions.agents.x-k8s.io", "v1beta1", "default", "sandboxclaims",
                                               field_selector=f"metadata.name={sandbox.claim_name}")
    assert [item["metadata"]["name"] for item in listed["items"]] == [sandbox.claim_name]
    with pytest.raises(kube.ApiException) as conflict:
        api.create_namespaced_custom_object("extensions.agents.x-k8s.io", "v1beta1", "default", "sandboxclaims",
                                            {"metadata": {"name": sandbox.claim_name},
                                             "spec": {"warmPoolRef": {"name": "python-pool"}}})
    assert conflict.value.status == 409
    with pytest.raises(kube.ApiException) as invalid:
        api.create_namespaced_custom_object("extensions.agents.x-k8s.io", "v1beta1", "default", "sandboxclaims",
                                            {"metadata": {"name": "with-volumes"},
                                             "spec": {"warmPoolRef": {"name": "python-pool"},
                                                      "volumeClaimTemplates": [{"metadata": {"name": "v"}}]}})
    assert invalid.value.status == 422 and "spec.volumeClaimTemplates" in invalid.value.body
    alice.delete_sandbox(sandbox.claim_name)


@pytest.mark.anyio
async def test_the_async_client(router: Router) -> None:
    api_client = await async_config.new_client_from_config(router.kubeconfig("alice"))
    async with AsyncSandboxClient(connection_config=router.connection("alice"), cleanup=False,
                                  api_client=api_client) as client:
        sandbox = await client.create_sandbox(warmpool="python-pool", labels={"run": "async"})
        result = await sandbox.commands.run("echo async", timeout=5)
        assert (result.stdout, result.exit_code) == ("async\n", 0)
        await sandbox.files.write("a.txt", b"A")
        assert await sandbox.files.read("a.txt") == b"A"
        assert [entry.name for entry in await sandbox.files.list(".") if entry.name == "a.txt"] == ["a.txt"]
        assert await sandbox.files.exists("a.txt")
        assert sandbox.claim_name in await client.list_all_sandboxes(label_selector="run=async")
        assert (await client.get_sandbox(sandbox.claim_name)).sandbox_id == sandbox.sandbox_id
        with pytest.raises(SandboxWarmPoolNotFoundError):
            await client.create_sandbox(warmpool="no-such-pool", sandbox_ready_timeout=5)
        await client.delete_sandbox(sandbox.claim_name)
        assert sandbox.claim_name not in await client.list_all_sandboxes()
    await api_client.close()  # the caller's to close, as the client documents
