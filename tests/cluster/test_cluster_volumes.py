"""Volumes through a router over two node agents: each lives on one node, and claims naming it go there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rollbox.client import SandboxClient
from rollbox.errors import InvalidRequest, VolumeInUse, VolumeNotFound
from tests.support.cluster import ADMINS, TOKENS, running_cluster
from tests.support.engines import BASIC

TEMPLATE = {"apiVersion": "rollbox.dev/v1alpha1", "kind": "SandboxTemplate", **BASIC}


@pytest.fixture(scope="module")
def alice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:
    root: Path = tmp_path_factory.mktemp("volumes-cluster")
    with running_cluster(root, {"alpha": 8, "beta": 8}, tokens=TOKENS, admins=ADMINS) as cluster, \
            SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
        client.apply(yaml.safe_dump(TEMPLATE) + "\n")
        yield client


def test_a_claim_naming_a_volume_lands_on_its_node(alice: SandboxClient) -> None:
    alice.create_volume("data", "16Mi")
    with pytest.raises(VolumeInUse):
        alice.create_volume("data", "16Mi")
    alice.create_volume("other", "16Mi")  # on the other node: as loaded, and holding fewer of alice's volumes
    assert [volume.name for volume in alice.list_volumes()] == ["data", "other"]
    boxes = [alice.create_sandbox(template="basic", volumes=[{"name": "data", "mount_path": "/data",
                                                              "read_only": True}]) for _ in range(4)]
    try:
        assert len({box.id.rpartition("-")[0] for box in boxes}) == 1
        assert {use.sandbox for use in alice.get_volume("data").mounted_by} == {box.id for box in boxes}
        with pytest.raises(InvalidRequest):
            alice.create_sandbox(template="basic", volumes=[{"name": "data", "mount_path": "/data"},
                                                            {"name": "other", "mount_path": "/other"}])
    finally:
        for box in boxes:
            box.delete()
    alice.delete_volume("data")
    alice.delete_volume("other")
    with pytest.raises(VolumeNotFound):
        alice.get_volume("data")
    assert alice.list_volumes() == []
