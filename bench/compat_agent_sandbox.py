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

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from k8s_agent_sandbox import SandboxClient as AgentSandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from kubernetes import config
from rich.console import Console
from rich.table import Table

from common import Figures, distribution, load, machine, timed
from compat_e2b import server
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
ROLLBOX = Path(sys.executable).with_name("rollbox")


def refilled(client: SandboxClient) -> None:
    deadline = time.monotonic() + 60
    while client.get_warmpool(POOL).ready < REPLICAS:
        if time.monotonic() > deadline:
            raise RuntimeError("the warm pool did not refill in a minute")
        time.sleep(0.01)


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
            refilled(client)
            samples: dict[str, list[float]] = {"create_agent_sandbox": [], "create_rollbox": [],
                                               "run_true_agent_sandbox": [], "run_true_rollbox": []}

            def create_agent_sandbox() -> Callable[[], None]:
                sandbox = agent.create_sandbox(warmpool=POOL)
                return lambda: agent.delete_sandbox(sandbox.claim_name)

            def create_rollbox() -> Callable[[], None]:
                return client.create_sandbox(warmpool=POOL).delete

            for create in (create_agent_sandbox, create_rollbox):  # once each untimed: connections and imports warm
                refilled(client)
                create()()
            for _ in range(creates):
                for name, create in (("create_agent_sandbox", create_agent_sandbox),
                                     ("create_rollbox", create_rollbox)):
                    refilled(client)
                    start = time.perf_counter()
                    delete = create()
                    samples[name].append((time.perf_counter() - start) * 1000)
                    delete()

            agent_sandbox = agent.create_sandbox(warmpool=POOL)
            rollbox_sandbox = client.create_sandbox(warmpool=POOL)
            runs_of: dict[str, Callable[[], object]] = {
                "run_true_agent_sandbox": lambda: agent_sandbox.commands.run("true"),
                "run_true_rollbox": lambda: rollbox_sandbox.commands.run("true")}
            try:
                for run in runs_of.values():
                    run()
                for _ in range(runs):
                    for name, run in runs_of.items():
                        samples[name].append(timed(run))
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
    m = figures["machine"]
    table = Table(title=f"agent-sandbox's client against rollbox ({m['cores']} cores, {m['memory_mb']} MB, kernel "
                        f"{m['kernel']}, runc {m['runc']}, load {m['load_before']} -> {m['load_after']})")
    for column in ("what", "client", "p50 ms", "p99 ms", "n", "target"):
        table.add_column(column)
    rows = [("create_sandbox(warmpool=)", "create", f"p50 <= {CREATE_TARGET_MS:g} ms (agent-sandbox)"),
            ("commands.run('true')", "run_true", f"agent-sandbox within {RUN_RATIO_TARGET:g}x rollbox "
                                                  f"(now {figures['run_true_ratio']}x)")]
    for what, prefix, target in rows:
        for sdk in ("agent_sandbox", "rollbox"):
            value = figures[f"{prefix}_{sdk}"]
            table.add_row(what, sdk.replace("_", "-"), f"{value['p50']:.2f}", f"{value['p99']:.2f}",
                          str(value["n"]), target if sdk == "agent_sandbox" else "baseline")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 creates and 200 runs per client (not 100 and 1000)")
    args = parser.parse_args()
    start = time.perf_counter()
    figures = measure(30, 200) if args.quick else measure(100, 1000)
    figures["mode"] = "quick" if args.quick else "full"
    figures["elapsed_s"] = round(time.perf_counter() - start, 1)
    Console(width=160).print(report(figures))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
