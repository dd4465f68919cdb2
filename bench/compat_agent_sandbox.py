"""agent-sandbox's own Python client, unmodified, against rollbox, beside rollbox's own SDK in the same run.

Run as root: `.venv/bin/python bench/compat_agent_sandbox.py [--quick]`. It starts `rollbox serve` on a free
loopback port (Kubernetes clients speak TCP only) with a throw-away data directory and a token, applies
agent-sandbox's own SandboxTemplate and SandboxWarmPool with `rollbox apply`, writes a kubeconfig with
`rollbox kubeconfig`, and times, in turns so that both meet the same moments of a shared machine:

- `create_sandbox(warmpool=...)` returning a ready sandbox: the SandboxClaim created, watched until bound and
  Ready, the handle connected; beside rollbox's `create_sandbox(warmpool=)`. The pool is let refill between
  claims (not timed), and each sandbox is deleted (not timed), so every claim is warm;
- `commands.run("true")` in one live sandbox through each client.

It prints a table (p50 and p99 in milliseconds) and, as its last line, one JSON object of every figure with
`missed`, the targets not met: `create_sandbox` p50 <= 20 ms, and `commands.run("true")` within twice rollbox's.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from k8s_agent_sandbox import SandboxClient as AgentSandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from kubernetes import config
from rich.table import Table

from common import Figures, distribution, load, machine
from compat import ROLLBOX, comparison, in_turns, main, refilled, server
from rollbox.client import SandboxClient

POOL = "agent-sandbox-bench"
REPLICAS = 4
MANIFEST = f"""\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {{name: {POOL}}}
spec:
  podTemplate:
    spec:
      containers: [{{name: runtime, image: host}}]
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {{name: {POOL}}}
spec:
  replicas: {REPLICAS}
  sandboxTemplateRef: {{name: {POOL}}}
"""
CREATE_TARGET_MS = 20.0
RUN_RATIO_TARGET = 2.0


def measure(creates: int, runs: int) -> Figures:
    figures: Figures = {"machine": machine()}
    with server() as (url, token), tempfile.TemporaryDirectory(prefix="rollbox-bench-k8s-") as root:
        manifest, kubeconfig = Path(root) / "pool.yaml", Path(root) / "kubeconfig"
        manifest.write_text(MANIFEST)
        remote = ["--url", url, "--token", token]
        subprocess.run([str(ROLLBOX), "apply", "-f", str(manifest), *remote], check=True, capture_output=True)
        subprocess.run([str(ROLLBOX), "kubeconfig", *remote, "-o", str(kubeconfig)], check=True, capture_output=True)
        agent = AgentSandboxClient(
            connection_config=SandboxDirectConnectionConfig(api_url=url,
                                                            extra_headers={"Authorization": f"Bearer {token}"}),
            api_client=config.new_client_from_config(str(kubeconfig)))
        with SandboxClient(url, token=token) as client:
            refilled(client, POOL, REPLICAS)
            deletes: list[Callable[[], object]] = []

            def create_agent_sandbox() -> None:
                sandbox = agent.create_sandbox(warmpool=POOL)
                deletes.append(lambda: agent.delete_sandbox(sandbox.claim_name))

            def create_rollbox() -> None:
                deletes.append(client.create_sandbox(warmpool=POOL).delete)

            def deleted_and_refilled() -> None:  # untimed: every claim is a warm one
                while deletes:
                    deletes.pop()()
                refilled(client, POOL, REPLICAS)

            samples: dict[str, list[float]] = {}
            in_turns({"create_agent_sandbox": create_agent_sandbox, "create_rollbox": create_rollbox}, creates,
                     samples, before=deleted_and_refilled)
            deleted_and_refilled()
            agent_sandbox = agent.create_sandbox(warmpool=POOL)
            rollbox_sandbox = client.create_sandbox(warmpool=POOL)
            try:
                in_turns({"run_true_agent_sandbox": lambda: agent_sandbox.commands.run("true"),
                          "run_true_rollbox": lambda: rollbox_sandbox.commands.run("true")}, runs, samples)
            finally:
                agent.delete_all()
                rollbox_sandbox.delete()
    figures.update({name: distribution(values) for name, values in samples.items()})
    figures["run_true_ratio"] = round(figures["run_true_agent_sandbox"]["p50"] / figures["run_true_rollbox"]["p50"], 2)
    figures["machine"]["load_after"] = load()
    figures["missed"] = [name for name, met in (
        ("create_agent_sandbox", figures["create_agent_sandbox"]["p50"] <= CREATE_TARGET_MS),
        ("run_true_ratio", figures["run_true_ratio"] <= RUN_RATIO_TARGET)) if not met]
    return figures


def report(figures: Figures) -> Table:
    return comparison("agent-sandbox's client against rollbox", figures, [
        ("create_sandbox(warmpool=)", "create", f"p50 <= {CREATE_TARGET_MS:g} ms (agent-sandbox)"),
        ("commands.run('true')", "run_true",
         f"agent-sandbox within {RUN_RATIO_TARGET:g}x rollbox (now {figures['run_true_ratio']}x)")], "agent_sandbox")


if __name__ == "__main__":
    main(__doc__, measure, report)
