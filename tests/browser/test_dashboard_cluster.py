"""The dashboard of a cluster's router in Chromium: its nodes as the router sees them, and sandboxes from each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rollbox.client import SandboxClient
from tests.browser.conftest import eventually, sign_in
from tests.support.cluster import Cluster, claim_on_every_node, router_health, running_cluster, wait_for
from tests.support.servers import ADMINS, RL_TEMPLATE, TOKENS

NODES = {"alpha": 8, "beta": 8}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Outlives each test's page, which polls it until the page closes."""
    with running_cluster(tmp_path_factory.mktemp("cluster"), NODES, tokens=TOKENS, admins=ADMINS) as running:
        yield running


def test_a_routers_dashboard_shows_its_nodes_and_every_nodes_sandboxes(cluster: Cluster, page: Any) -> None:
    with SandboxClient(cluster.url, TOKENS["alice"]) as alice:
        alice.apply(str(RL_TEMPLATE))
        wait_for(lambda: alice.get_warmpool("rl-python").ready == alice.get_warmpool("rl-python").target,
                 "the warm pool full")
        held = claim_on_every_node(alice, "rl-python", NODES)
        sign_in(page, cluster.url, TOKENS["alice"])

        def nodes_shown() -> bool:
            health = router_health(cluster.url)["nodes"]
            shown = page.eval_on_selector_all("#nodes tbody tr", """rows => Object.fromEntries(rows.map(row =>
                [row.dataset.name, [...row.cells].slice(1, 5).map(cell => cell.textContent)]))""")
            return shown == {name: [node["status"], str(node["sandboxes"]), str(node["claims"]),
                                    str(node["max_sandboxes"])] for name, node in health.items()}
        eventually(nodes_shown, "the page's nodes are the router's")
        assert page.is_visible("#nodes-section")
        rows = page.eval_on_selector_all("#sandboxes tbody tr", "rows => rows.map(row => row.dataset.id)")
        assert sorted(rows) == sorted(sandbox.id for sandbox in held.values())
        for sandbox in held.values():
            sandbox.delete()
