"""Images on a cluster: two node agents and a router (nginx at its edge), a registry with basic auth on loopback.

A claim of an image goes to the node that has it; `all_nodes` pulls on each; credentials reach every node.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollbox import errors
from rollbox.client import SandboxClient
from tests.support.cluster import TOKENS, Cluster, node_of, running_cluster
from tests.support.registry import ImageMaker, Registry, busybox_layer, make_layer, module_registry

PASSWORD = "cluster-registry-password"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from module_registry(tmp_path_factory, {"alice": PASSWORD})


@pytest.fixture(scope="module")
def images(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    maker = ImageMaker(tmp_path_factory.mktemp("images"))
    base = busybox_layer()
    for number in range(3):
        maker.image(f"env-{number}", [base, make_layer({"env": f"{number}\n"})])
    return [registry.push(maker, f"env-{number}", f"swe/env-{number}", as_tag="1") for number in range(3)]


@pytest.fixture(scope="module")
def cluster(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster"), {"alpha": 8, "beta": 8}, tokens=TOKENS,
                         admins=("alice",), node_args=["--insecure-registry", registry.host]) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def alice(cluster: Cluster, registry: Registry) -> Iterator[SandboxClient]:
    with SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
        client.registries.login(registry.host, "alice", PASSWORD)
        yield client


def test_claims_of_an_image_go_where_its_layers_are(alice: SandboxClient, images: list[str]) -> None:
    alice.images.pull(images[0])
    holders = {info.digest for info in alice.images.list()}
    assert len(holders) == 1
    nodes = set()
    for _ in range(4):
        with alice.create_sandbox(image=images[0]) as sandbox:
            assert sandbox.commands.run("cat /env").stdout == "0\n"
            nodes.add(node_of(sandbox.id))
    assert len(nodes) == 1, f"claims of one image went to {nodes}"


def test_pull_on_every_node_and_credentials_on_every_node(cluster: Cluster, alice: SandboxClient,
                                                          images: list[str]) -> None:
    events = []
    alice.images.pull(images[1], all_nodes=True, on_progress=events.append)
    told = {event.message.split(":", 1)[0] for event in events if event.event == "progress" and event.message}
    assert told >= {"alpha", "beta"}
    held = [alice.create_sandbox(image=images[1]) for _ in range(6)]  # both hold it: claims spread by load
    try:
        assert {node_of(sandbox.id) for sandbox in held} == set(cluster.nodes)
        assert all(sandbox.commands.run("cat /env").stdout == "1\n" for sandbox in held)
    finally:
        for sandbox in held:
            sandbox.delete()


def test_another_tenant_is_refused_on_every_node(cluster: Cluster, alice: SandboxClient, images: list[str]) -> None:
    alice.images.pull(images[2], all_nodes=True)
    with SandboxClient(cluster.url, token=TOKENS["bob"]) as bob:
        for _ in range(3):
            with pytest.raises(errors.ImageNotFound):
                bob.create_sandbox(image=images[2])
        assert bob.images.list() == []
