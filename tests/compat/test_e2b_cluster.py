"""E2B's SDK through a cluster's router: the facade stands on the `Node` interface alone, so the router's
`ClusterNode` serves it as the embedded node does, each sandbox's calls (its commands too, which are the node's
background processes) forwarded to the node its id names."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b import Sandbox, SandboxNotFoundException

from rollbox.client import SandboxClient
from tests.compat.test_e2b import POOL
from tests.support.cluster import TOKENS, running_cluster, wait_for
from tests.support.servers import TEMPLATE

pytestmark = pytest.mark.slow


def test_the_sdk_through_a_cluster_router(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", {"alpha": 4}, tokens=TOKENS, admins=("alice",)) as cluster:
        with SandboxClient(cluster.url, token=TOKENS["alice"]) as client:
            client.apply(TEMPLATE + "---\n" + POOL)
            wait_for(lambda: client.get_warmpool("e2b-pool").ready == 2, "the warm pool fills")
        where = {"api_url": cluster.url, "sandbox_url": cluster.url, "api_key": TOKENS["alice"]}
        sandbox = Sandbox.create(template="e2b-pool", metadata={"via": "router"}, **where)
        assert sandbox.sandbox_id.startswith("alpha-")
        sandbox.files.write("/tmp/x.txt", "through the router")
        assert sandbox.files.read("/tmp/x.txt") == "through the router"
        assert sandbox.commands.run("cat /tmp/x.txt").stdout == "through the router"
        handle = sandbox.commands.run("read line; echo got $line", background=True, stdin=True)
        handle.send_stdin("it\n")
        assert handle.wait().stdout == "got it\n"
        assert sandbox.get_info().metadata == {"via": "router"}
        sandbox.set_timeout(600)
        assert [found.sandbox_id for found in Sandbox.list(**where).next_items()] == [sandbox.sandbox_id]
        assert sandbox.kill()
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sandbox.sandbox_id, **where)


def test_a_template_built_through_the_router_carries_its_files_to_the_nodes(tmp_path: Path) -> None:
    """The router unpacks the uploaded files and sends them on with the Dockerfile to every node that builds."""
    from e2b import Template

    from tests.compat.test_e2b_templates import TOOLS
    from tests.support.images import busybox_layout

    (tmp_path / "image").mkdir()
    base = f"oci:{busybox_layout(tmp_path / 'image')}:base"
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "data.txt").write_text("from the trainer\n")
    with running_cluster(tmp_path / "cluster", {"alpha": 4}, tokens=TOKENS, admins=("alice",)) as cluster:
        where = {"api_url": cluster.url, "sandbox_url": cluster.url, "api_key": TOKENS["alice"]}
        template = Template(file_context_path=str(tmp_path)).from_image(base).run_cmd(TOOLS, user="root") \
            .copy("files/data.txt", "/opt/data.txt")
        Template.build(template, "e2b-routed", **where)
        sandbox = Sandbox.create(template="e2b-routed", **where)
        try:
            assert sandbox.commands.run("cat /opt/data.txt").stdout == "from the trainer\n"
        finally:
            sandbox.kill()
