"""Images through the whole stack: the real SDK and CLI against a real router, pulling from a real registry (basic
auth) on loopback; two tenants, one with credentials for the private images and one without."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollbox import errors
from rollbox.client import SandboxClient
from rollbox.engine.images.registry import RegistrySettings
from rollbox.models import PullEvent
from tests.support.registry import (
    CuttingProxy,
    ImageMaker,
    Registry,
    busybox_layer,
    make_layer,
    module_registry,
)
from tests.support.servers import router

TOKENS = {"alice": "alice-token", "bob": "bob-token"}
PASSWORD = "s3cret-registry-password"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from module_registry(tmp_path_factory, {"alice": PASSWORD})


@pytest.fixture(scope="module")
def counting(registry: Registry) -> Iterator[CuttingProxy]:
    """The registry behind a proxy that counts blob downloads (and cuts none)."""
    proxy = CuttingProxy(registry.host, cuts=0).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def images(registry: Registry, counting: CuttingProxy, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    maker = ImageMaker(tmp_path_factory.mktemp("images"))
    base = busybox_layer()
    refs = {}
    for number in range(3):
        maker.image(f"task-{number}", [base, make_layer({"task": f"{number}\n"})],
                    env={"PATH": "/bin", "TASK": str(number)}, workdir="/")
        refs[f"task-{number}"] = registry.push(maker, f"task-{number}", f"swe/task-{number}", as_tag="v1") \
            .replace(registry.host, counting.host)
    return refs


@pytest.fixture(scope="module")
def url(counting: CuttingProxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with router(tmp_path_factory.mktemp("images-router"), TOKENS, ("alice",),
                RegistrySettings(insecure=frozenset({counting.host}))) as url:
        yield url


@pytest.fixture(scope="module")
def alice(url: str, counting: CuttingProxy) -> Iterator[SandboxClient]:
    with SandboxClient(url, token="alice-token") as client:
        client.registries.login(counting.host, "alice", PASSWORD)
        yield client


@pytest.fixture(scope="module")
def bob(url: str) -> Iterator[SandboxClient]:
    with SandboxClient(url, token="bob-token") as client:
        yield client


def test_pull_shows_layers_and_lists_sizes_with_shared_layers_once(alice: SandboxClient,
                                                                   images: dict[str, str]) -> None:
    events: list[PullEvent] = []
    pulled = alice.images.pull(images["task-0"], images["task-1"], on_progress=events.append)
    assert [info.names for info in pulled] == [[images["task-0"]], [images["task-1"]]]
    assert any("layer 1/2" in (event.message or "") and "MB/s" in (event.message or "") for event in events)
    listed = {info.names[0]: info for info in alice.images.list()}
    assert set(listed) >= {images["task-0"], images["task-1"]}
    first, second = listed[images["task-0"]], listed[images["task-1"]]
    shared = set(first.layer_bytes) & set(second.layer_bytes)
    assert len(shared) == 1 and first.shared == second.shared == first.layer_bytes[shared.pop()] > 0
    assert alice.registries.list()[0].username == "alice"
    assert PASSWORD not in json.dumps([info.model_dump() for info in alice.registries.list()])


def test_claim_of_an_image_starts_it_as_it_is(alice: SandboxClient, images: dict[str, str]) -> None:
    read_pids = "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max"
    with alice.create_sandbox(image=images["task-2"], env={"EXTRA": "1"}, limits={"pids": 77}) as sandbox:
        result = sandbox.commands.run(f"echo $TASK $EXTRA; cat /task; id -u; {read_pids}")
        sandbox.reset()
        after_reset = sandbox.commands.run(read_pids).stdout.strip()
    assert result.stdout.split() == ["2", "1", "2", "0", "77"]
    assert after_reset == "77", "a reset dropped the claim's own limits"


def test_concurrent_claims_of_a_new_image_pull_it_once(alice: SandboxClient, registry: Registry,
                                                       counting: CuttingProxy, tmp_path: Path) -> None:
    maker = ImageMaker(tmp_path)
    maker.image("fresh", [busybox_layer(), make_layer({"fresh": "yes\n"})])
    reference = registry.push(maker, "fresh", "swe/fresh", as_tag="1").replace(registry.host, counting.host)
    before = counting.blob_requests

    def claim(_: int) -> str:
        with alice.create_sandbox(image=reference) as sandbox:
            return sandbox.commands.run("cat /fresh").stdout

    with ThreadPoolExecutor(max_workers=8) as pool:
        outputs = list(pool.map(claim, range(8)))
    assert outputs == ["yes\n"] * 8
    assert counting.blob_requests - before == 2, "the image's config and new layer were fetched more than once"


def test_another_tenant_cannot_start_or_see_a_cached_private_image(alice: SandboxClient, bob: SandboxClient,
                                                                   images: dict[str, str]) -> None:
    alice.images.pull(images["task-0"])
    with pytest.raises(errors.ImageNotFound, match="credentials"):
        bob.create_sandbox(image=images["task-0"])
    assert bob.images.list() == []
    with pytest.raises(errors.ImageNotFound):
        bob.images.remove(images["task-0"])
    with pytest.raises(errors.Forbidden):
        bob.images.prune()


def test_bad_image_claims_get_clear_answers(alice: SandboxClient, images: dict[str, str]) -> None:
    with pytest.raises(errors.InvalidRequest, match=r"spellings|digest|repository"):
        alice.create_sandbox(image="NOT A/REFERENCE")
    with pytest.raises(errors.InvalidRequest, match="not two"):
        alice.create_sandbox(image=images["task-0"], template="basic")
    with pytest.raises(errors.InvalidRequest, match="over what this node gives"):
        alice.create_sandbox(image=images["task-0"], limits={"cpu": 4096})
    with pytest.raises(errors.ImageNotFound):
        alice.create_sandbox(image=images["task-0"].replace("task-0", "no-such-task"))


def test_cli_pulls_lists_and_removes(url: str, images: dict[str, str], counting: CuttingProxy) -> None:
    env = {"ROLLBOX_URL": url, "ROLLBOX_TOKEN": "alice-token", "PATH": "/usr/bin:/bin"}

    def rollbox(*argv: str, stdin: str | None = None) -> str:
        done = subprocess.run([str(Path(".venv/bin/rollbox").resolve()), *argv], capture_output=True, text=True,
                              env=env, input=stdin, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "credentials stored" in rollbox("registry", "login", counting.host, "-u", "alice", "--password-stdin",
                                           stdin=PASSWORD + "\n")
    assert "pulled" in rollbox("image", "pull", images["task-1"])
    listing = rollbox("image", "ls")
    assert images["task-1"] in listing and "on disk (shared layers once)" in listing
    rollbox("image", "rm", images["task-1"])
    assert images["task-1"] not in rollbox("image", "ls")


def test_a_warm_pool_of_an_image_hands_out_its_sandboxes(alice: SandboxClient, images: dict[str, str]) -> None:
    alice.apply(f"""
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {{name: task-pool}}
spec: {{replicas: 2, image: "{images['task-1']}"}}
""")
    wait = time.monotonic() + 60
    while alice.get_warmpool("task-pool").ready < 2:
        assert time.monotonic() < wait, "the image's pool did not fill"
        time.sleep(0.1)
    with alice.create_sandbox(image=images["task-1"], warmpool="task-pool") as sandbox:
        assert sandbox.commands.run("cat /task").stdout == "1\n"
    assert not any(template.name.startswith("image-") for template in alice.list_templates())
    alice.delete_warmpool("task-pool")


def test_template_names_of_images_are_reserved(alice: SandboxClient) -> None:
    with pytest.raises(errors.InvalidResource, match="choose another name"):
        alice.apply("apiVersion: rollbox.dev/v1alpha1\nkind: SandboxTemplate\nmetadata: {name: image-mine}\n")
