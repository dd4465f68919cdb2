"""agent-sandbox's client through a cluster's router: the facade stands on the `Node` interface alone, so the
router's `ClusterNode` serves it as the embedded node does, each call forwarded to the node its sandbox id names."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from kubernetes import config

from tests.compat.test_agent_sandbox import POOL
from tests.support.cluster import ROLLBOX, TOKENS, running_cluster, wait_for

pytestmark = pytest.mark.slow


def test_the_client_through_a_cluster_router(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", {"alpha": 4}, tokens=TOKENS, admins=("alice",)) as cluster:
        remote = ["--url", cluster.url, "--token", TOKENS["alice"]]
        (tmp_path / "pool.yaml").write_text(POOL)
        subprocess.run([str(ROLLBOX), "apply", "-f", str(tmp_path / "pool.yaml"), *remote], check=True,
                       capture_output=True)
        subprocess.run([str(ROLLBOX), "kubeconfig", *remote, "-o", str(tmp_path / "kubeconfig")], check=True,
                       capture_output=True)
        client = SandboxClient(
            connection_config=SandboxDirectConnectionConfig(
                api_url=cluster.url, extra_headers={"Authorization": f"Bearer {TOKENS['alice']}"}),
            api_client=config.new_client_from_config(str(tmp_path / "kubeconfig")))
        sandbox = client.create_sandbox(warmpool="python-pool")
        assert sandbox.sandbox_id.startswith("alpha-")
        assert sandbox.commands.run("echo $FLAVOUR", timeout=10).stdout == "rollbox\n"
        sandbox.files.write("x.txt", "through the router")
        assert sandbox.files.read("x.txt") == b"through the router"
        assert client.list_all_sandboxes() == [sandbox.claim_name]
        client.delete_sandbox(sandbox.claim_name)
        wait_for(lambda: client.list_all_sandboxes() == [], "the claim gone")
