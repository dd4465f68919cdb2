"""Named volumes through the HTTP API, the SDK (sync and async) and a server that is SIGKILLed and started again."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.engine import Engine
from rollbox.errors import VolumeInUse, VolumeNotFound
from tests.server.test_server import TEMPLATE, TOKENS, Server
from tests.support.cluster import wait_for
from tests.support.engines import teardown_engine
from tests.support.volumes import loop_devices, mounted, wait_detached

WORKSPACE = {"name": "ws", "mount_path": "/workspace"}


def _serve(data_dir: Path) -> Iterator[Server]:
    server = Server(data_dir, tokens=TOKENS, admins=["alice"])
    server.start()
    SandboxClient(server.url, token=TOKENS["alice"]).apply(_yaml(TEMPLATE))
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module: each test leaves no volume or sandbox behind (and restarts it if it stops it)."""
    yield from _serve(tmp_path_factory.mktemp("volumes") / "data")


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    yield from _serve(tmp_path / "data")


def _yaml(document: dict) -> str:
    import yaml

    return yaml.safe_dump(document) + "\n"


def _image_of(server: Server) -> str:
    return str(server.data_dir / "volumes" / "images")


def test_a_workspace_outlives_its_sandboxes_and_a_server_crash(server: Server) -> None:
    alice = SandboxClient(server.url, token=TOKENS["alice"])
    bob = SandboxClient(server.url, token=TOKENS["bob"])
    created = alice.create_volume("ws", "64Mi")
    assert (created.name, created.size, created.mounted_by) == ("ws", 64 * 2**20, [])

    # Per tenant: bob sees nothing of alice's volume and names his own independently.
    with pytest.raises(VolumeNotFound):
        bob.get_volume("ws")
    assert bob.list_volumes() == []
    with pytest.raises(VolumeNotFound):
        bob.create_sandbox(template="basic", volumes=[WORKSPACE])
    bob.create_volume("ws", "16Mi")
    bob.delete_volume("ws")

    writer = alice.create_sandbox(template="basic", volumes=[WORKSPACE])
    assert writer.info.volumes[0].mount_path == "/workspace"
    assert writer.run("echo 'step 1' > /workspace/progress").ok
    with pytest.raises(VolumeInUse) as second:
        alice.create_sandbox(template="basic", volumes=[WORKSPACE])
    assert "read-write" in str(second.value)
    reader = alice.create_sandbox(template="basic", volumes=[{**WORKSPACE, "read_only": True}])
    assert reader.run("cat /workspace/progress").stdout == "step 1\n"
    assert not reader.run("echo x >> /workspace/progress").ok
    assert alice.list_sandboxes()  # claims still list
    info = alice.get_volume("ws")
    assert {(use.sandbox, use.read_only) for use in info.mounted_by} == {(writer.id, False), (reader.id, True)}
    assert info.used > 0
    with pytest.raises(VolumeInUse):
        alice.delete_volume("ws")

    # Not part of reset, nor of a fork's children (who get it read-only).
    writer.reset()
    assert writer.run("cat /workspace/progress").stdout == "step 1\n"
    assert loop_devices().count(_image_of(server)) == 1  # one loop device and one host mount per volume, ever
    assert sum(point.startswith(str(server.data_dir / "volumes" / "mnt")) for point in mounted()) == 1
    children = writer.fork(2)
    assert all(child.info.volumes[0].read_only for child in children)
    assert not children[0].run("echo child > /workspace/progress").ok
    for child in children:
        child.delete()

    # A crash: the restarted server mounts the image again (once) and gives the holds back.
    server.stop(signal.SIGKILL)
    server.start()
    writer = alice.get_sandbox(writer.id)
    assert writer.run("cat /workspace/progress && echo 'step 2' >> /workspace/progress").ok
    assert loop_devices().count(_image_of(server)) == 1
    with pytest.raises(VolumeInUse):
        alice.create_sandbox(template="basic", volumes=[WORKSPACE])

    writer.delete()
    reader.delete()
    again = alice.create_sandbox(template="basic", volumes=[WORKSPACE])  # the hold ended with the claim
    assert again.run("cat /workspace/progress").stdout == "step 1\nstep 2\n"
    again.delete()
    alice.delete_volume("ws")
    assert alice.list_volumes() == []
    wait_detached(_image_of(server))
    assert not any(point.startswith(str(server.data_dir / "volumes" / "mnt") + "/") for point in mounted())


def test_a_claim_creates_a_sized_volume_and_the_async_sdk_sees_it(server: Server) -> None:
    async def run() -> None:
        async with AsyncSandboxClient(server.url, token=TOKENS["alice"]) as alice:
            sandbox = await alice.create_sandbox(
                template="basic", volumes=[{"name": "cache", "mount_path": "/home/cache", "size": "32Mi"}])
            result = await sandbox.run("dd if=/dev/zero of=/home/cache/big bs=1M count=40 2>&1; echo rc=$?")
            assert "No space left on device" in result.stdout
            [volume] = await alice.list_volumes()
            assert (volume.name, volume.size) == ("cache", 32 * 2**20)
            assert volume.used <= volume.size and volume.mounted_by[0].sandbox == sandbox.id
            await sandbox.delete()
            await alice.delete_volume("cache")
            assert await alice.list_volumes() == []

    asyncio.run(run())


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/volumes", {"name": "../etc", "size": "16Mi"}),
    ("POST", "/v1/volumes", {"name": "a/b", "size": "16Mi"}),
    ("POST", "/v1/volumes", {"name": "ok", "size": "1"}),
    ("POST", "/v1/volumes", {"name": "ok", "size": "-5Mi"}),
    ("POST", "/v1/volumes", {"name": "ok"}),
    ("GET", "/v1/volumes/..", None),
    ("GET", "/v1/volumes/%2e%2e%2fx", None),
    ("DELETE", "/v1/volumes/..%2f..%2fstate.db", None),
    ("POST", "/v1/sandboxes", {"template": "basic", "volumes": [{"name": "x", "mount_path": "/proc/self"}]}),
    ("POST", "/v1/sandboxes", {"template": "basic", "volumes": [{"name": "x", "mount_path": "/a/../../etc"}]}),
    ("POST", "/v1/sandboxes", {"template": "basic", "volumes": [{"name": "x", "mount_path": "/.rollbox/run"}]}),
    ("POST", "/v1/sandboxes", {"template": "basic", "volumes": [{"name": "..", "mount_path": "/w"}]}),
])
def test_bad_names_and_paths_answer_4xx(server: Server, method: str, path: str, body: dict | None) -> None:
    with server.client() as client:
        answer = client.request(method, path, json=body)
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.json()["error"]["code"] in ("invalid_request", "volume_not_found", "not_found")
    assert list((server.data_dir / "volumes" / "images").iterdir()) == []


def test_a_stopped_server_with_no_sandbox_leaves_no_loop_device(own_server: Server) -> None:
    server = own_server
    alice = SandboxClient(server.url, token=TOKENS["alice"])
    alice.create_volume("kept", "16Mi")
    server.stop()
    wait_detached(_image_of(server))
    server.start()
    assert [volume.name for volume in alice.list_volumes()] == ["kept"]
    assert _image_of(server) in loop_devices()
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKENS['alice']}"}) as client:
        assert client.delete("/v1/volumes/kept").status_code == 204
    server.stop()
    teardown_engine(Engine(server.data_dir))
    wait_detached(_image_of(server))


def test_the_cli_creates_lists_and_removes_volumes(server: Server) -> None:
    def rollbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(Path(sys.executable).parent / "rollbox"), *args, "--url", server.url,
                               "--token", TOKENS["alice"]], capture_output=True, text=True, timeout=60)

    created = rollbox("volume", "create", "cli-cache", "--size", "24Mi")
    assert (created.returncode, created.stdout.strip()) == (0, "volume/cli-cache created"), created.stderr
    listed = rollbox("volume", "ls")
    assert "cli-cache" in listed.stdout and "24Mi" in listed.stdout, listed
    as_json = json.loads(rollbox("get", "volumes", "cli-cache", "-o", "json").stdout)
    assert as_json[0]["size"] == 24 * 2**20 and as_json[0]["mounted_by"] == []
    refused = rollbox("volume", "create", "../x", "--size", "24Mi")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert rollbox("delete", "volume", "cli-cache").stdout.strip() == "volume/cli-cache deleted"
    missing = rollbox("volume", "rm", "cli-cache")
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_a_template_declares_volumes_its_claims_mount(server: Server) -> None:
    alice = SandboxClient(server.url, token=TOKENS["alice"])
    template = {**TEMPLATE, "metadata": {"name": "cached"},
                "spec": {**TEMPLATE["spec"], "volumes": [{"name": "pip-cache", "mountPath": "/cache", "size": "16Mi"}]}}
    pool = {"kind": "SandboxWarmPool", "metadata": {"name": "cached"},
            "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "cached"}}}
    alice.apply(_yaml(template) + "---\n" + _yaml(pool))
    wait_for(lambda: alice.get_warmpool("cached").ready == 1, "the warm pool full")
    first = alice.create_sandbox(warmpool="cached")  # started cold: a warm container has no volume
    assert [volume.name for volume in first.info.volumes] == ["pip-cache"]
    assert first.run("echo wheel > /cache/pkg && cat /cache/pkg").stdout == "wheel\n"
    with pytest.raises(VolumeInUse):
        alice.create_sandbox(warmpool="cached")
    reader = alice.create_sandbox(warmpool="cached", volumes=[{"name": "pip-cache", "mount_path": "/cache",
                                                               "read_only": True}])
    assert reader.run("cat /cache/pkg").stdout == "wheel\n"
    assert alice.get_warmpool("cached").ready == 1  # the pool's warm container was never taken
    for sandbox in (first, reader):
        sandbox.delete()
    alice.delete_warmpool("cached")
    alice.delete_template("cached")
    alice.delete_volume("pip-cache")
