"""The cluster tier: node agents and routers as real processes on this machine, one cluster per module.

The nodes differ in size (alpha holds 16 sandboxes, beta 8), so that a warm pool's split by room shows; alice is
the admin, bob another tenant.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollbox.client import SandboxClient
from tests.support.cluster import ADMINS, TOKENS, Cluster, running_cluster, wait_for
from tests.support.servers import RL_TEMPLATE

NODES = {"alpha": 16, "beta": 8}
POOL = "rl-python"
"""The warm pool of examples/templates/rl-python.yaml: 8 replicas, split 5 (alpha) and 3 (beta) by room."""
SHARES = {"alpha": 5, "beta": 3}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster"), NODES, tokens=TOKENS, admins=ADMINS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[SandboxClient]:
    """Alice's client, with examples/templates/rl-python.yaml applied through the router and its pool full."""
    with SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
        client.apply(str(RL_TEMPLATE))
        wait_for(lambda: client.get_warmpool(POOL).ready == sum(SHARES.values()), "the warm pool full")
        yield client


@pytest.fixture(scope="module")
def bob(cluster: Cluster) -> Iterator[SandboxClient]:
    with SandboxClient(cluster.url, token=TOKENS["bob"]) as bob:
        yield bob
