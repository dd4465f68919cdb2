"""Attacks on a cluster's seams: node agents called without the cluster secret, a tenant naming another tenant to
the router, a weak secret, and sandboxes reaching for their node agent or the router over the network."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import httpx

from rollbox.client import SandboxClient
from tests.cluster.conftest import NODES, POOL
from tests.support.cluster import (
    ROLLBOX,
    TOKENS,
    Cluster,
    claim_on_every_node,
    environment_without_secret,
    free_port,
    node_of,
    secret_of,
)

SECRET_VARIABLE = "ROLLBOX_CLUSTER_SECRET"


def test_a_node_agent_answers_only_the_secret_acting_for_a_tenant(cluster: Cluster, client: SandboxClient) -> None:
    secret = secret_of(cluster)
    with client.create_sandbox(warmpool=POOL) as sandbox:
        node = cluster.nodes[node_of(sandbox.id)]
        wrong = [None, "", "Bearer", f"Bearer {secret[:-1]}x", f"Bearer {secret[:16]}", f"Basic {secret}",
                 f"Bearer {TOKENS['alice']}", f"Bearer {secret}{secret}"]
        calls = [("GET", "/v1/sandboxes", None), ("GET", f"/v1/sandboxes/{sandbox.id}", None),
                 ("POST", f"/v1/sandboxes/{sandbox.id}/exec", {"command": "echo pwned"}),
                 ("DELETE", f"/v1/sandboxes/{sandbox.id}", None), ("GET", "/v1/templates", None),
                 ("POST", "/v1/apply", {"documents": []})]
        with httpx.Client(base_url=node.url, timeout=30) as http:
            for method, path, body in calls:
                for authorization in wrong:
                    headers = {"X-Rollbox-Tenant": "alice"}
                    if authorization is not None:
                        headers["Authorization"] = authorization
                    answer = http.request(method, path, json=body, headers=headers)
                    assert answer.status_code == 401, (method, path, authorization, answer.text)
                    assert answer.json()["error"]["code"] == "unauthorized"
                for tenant in ({}, {"X-Rollbox-Tenant": ""}):
                    answer = http.request(method, path, json=body, headers={"Authorization": f"Bearer {secret}",
                                                                             **tenant})
                    assert answer.status_code == 401 and "x-rollbox-tenant" in answer.text, (method, path, tenant)
            acting = {"Authorization": f"Bearer {secret}", "X-Rollbox-Tenant": "alice"}
            assert [info["id"] for info in http.get("/v1/sandboxes", headers=acting).json()] == [sandbox.id]
            assert http.get(f"/v1/sandboxes/{sandbox.id}", headers={**acting, "X-Rollbox-Tenant": "bob"}
                            ).status_code == 404
        assert sandbox.run("echo intact").stdout == "intact\n"


def test_the_router_takes_the_tenant_from_the_token_alone(cluster: Cluster, client: SandboxClient) -> None:
    """A tenant naming another in X-Rollbox-Tenant, or sending the cluster secret as a token, gets nothing."""
    secret = secret_of(cluster)
    with client.create_sandbox(warmpool=POOL) as sandbox, httpx.Client(base_url=cluster.url, timeout=30) as http:
        posing = {"Authorization": f"Bearer {TOKENS['bob']}", "X-Rollbox-Tenant": "alice"}
        assert http.get(f"/v1/sandboxes/{sandbox.id}", headers=posing).status_code == 404
        assert http.post(f"/v1/sandboxes/{sandbox.id}/exec", json={"command": "true"}, headers=posing
                         ).status_code == 404
        assert sandbox.id not in {info["id"] for info in http.get("/v1/sandboxes", headers=posing).json()}
        for headers in ({"Authorization": f"Bearer {secret}", "X-Rollbox-Tenant": "alice"},
                        {"X-Rollbox-Tenant": "alice"}):
            answer = http.get(f"/v1/sandboxes/{sandbox.id}", headers=headers)
            assert answer.status_code == 401, answer.text


def node_commands(tmp_path: Path, variants: list[tuple[list[str], dict[str, str]]]
                  ) -> list[subprocess.CompletedProcess[str]]:
    """`rollbox node` with each variant's secret arguments and environment, all at once (each loads Python)."""
    started = [(arguments, subprocess.Popen(
        [str(ROLLBOX), "node", "--name", "weak", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
         *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**environment_without_secret(), **env})) for arguments, env in variants]
    done = []
    for arguments, process in started:
        stdout, stderr = process.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(arguments, process.returncode, stdout, stderr))
    return done


def test_rollbox_node_refuses_a_short_or_missing_secret(tmp_path: Path) -> None:
    """Before it touches the data directory: a weak secret is guessed, and then every sandbox is the guesser's."""
    short = tmp_path / "short"
    short.write_text("fifteen-chars15\n")
    *refusals, missing, unreadable = node_commands(tmp_path, [
        (["--secret-file", str(short)], {}), ([], {SECRET_VARIABLE: "0123456789abcde"}), ([], {}),
        (["--secret-file", str(tmp_path / "none")], {})])
    for done in refusals:
        assert done.returncode == 1, done
        assert done.stderr.count("\n") == 1 and "15 characters" in done.stderr and "at least 16" in done.stderr, (
            done.stderr)
    assert missing.returncode == 1 and SECRET_VARIABLE in missing.stderr and "--secret-file" in missing.stderr
    assert unreadable.returncode == 1 and "cannot read the secret file" in unreadable.stderr
    assert not (tmp_path / "data").exists()


def host_addresses() -> list[str]:
    """This machine's addresses other than loopback, v4 and v6."""
    shown = json.loads(subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True,
                                      check=True).stdout)
    return [address["local"] for interface in shown for address in interface.get("addr_info", [])
            if address.get("scope") != "host" and not address["local"].startswith("fe80")]


REACH = """
import errno, json, socket, sys
results = {}
for host, port in json.loads(sys.argv[1]):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.settimeout(3)
        try:
            probe.connect((host, port))
            results[f"{host} {port}"] = "CONNECTED"
        except OSError as error:
            results[f"{host} {port}"] = errno.errorcode.get(error.errno, repr(error))
print(json.dumps(results))
"""


def test_sandboxes_cannot_reach_their_node_agent_or_the_router(cluster: Cluster, client: SandboxClient) -> None:
    """Each port answers on the host's loopback; from inside a sandbox on each node, the same 127.0.0.1 is the
    sandbox's own (refused), and every address of the host has no route (unreachable)."""
    ports = [node.port for node in cluster.nodes.values()] + [router.port for router in cluster.routers]
    for port in ports:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    addresses = host_addresses()
    targets = [("127.0.0.1", port) for port in ports] + [(address, port) for address in addresses
                                                         for port in ports]
    held = claim_on_every_node(client, POOL, NODES)
    try:
        for name, sandbox in held.items():
            for user in (None, "root"):
                done = sandbox.run(["python3", "-c", REACH, json.dumps(targets)], user=user, timeout=60)
                assert done.exit_code == 0, done
                results = json.loads(done.stdout)
                assert len(results) == len(targets)
                for target, outcome in results.items():
                    host = target.split()[0]
                    expected = "ECONNREFUSED" if host == "127.0.0.1" else "ENETUNREACH"
                    assert outcome == expected, (name, user, target, outcome)
    finally:
        for sandbox in held.values():
            sandbox.delete()
