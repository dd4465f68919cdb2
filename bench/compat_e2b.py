"""E2B's SDK, unmodified, against rollbox, beside rollbox's own SDK in the same run.

Run as root: `.venv/bin/python bench/compat_e2b.py [--quick]`. It starts `rollbox serve` on a free loopback port
(the SDK speaks TCP only) with a throw-away data directory and a token, applies a template and a warm pool, and
times, in turns so that both meet the same moments of a shared machine:

- a sandbox's life as E2B's SDK lives it: `Sandbox.create()` from the warm pool, `commands.run("true")`, `kill()`,
  beside the same through rollbox's SDK (`create_sandbox(warmpool=)`, `commands.run("true")`, `delete()`); the pool
  is let refill between lives (not timed), so every create is a warm claim;
- `commands.run("true")` in one live sandbox through each SDK, and through rollbox's SDK the command E2B's SDK
  actually sends, `/bin/bash -l -c true` (bash starts slower than `/bin/sh`): the like-for-like comparison.

It prints a table (p50 and p99 in milliseconds) and, as its last line, one JSON object of every figure with
`missed`, the targets not met: a life through E2B's SDK p50 <= 25 ms, and its `commands.run("true")` within twice
rollbox's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from rich.table import Table

from common import Figures, distribution, load, machine
from compat import comparison, in_turns, main, refilled, server
from rollbox.client import SandboxClient

POOL = "e2b-bench"
REPLICAS = 4
DOCUMENTS = f"""\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {{name: {POOL}}}
spec:
  steps:
    - run: "true"
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {{name: {POOL}}}
spec:
  sandboxTemplateRef: {{name: {POOL}}}
  replicas: {REPLICAS}
  refillConcurrency: {REPLICAS}
"""
LIFE_TARGET_MS = 25.0
RUN_RATIO_TARGET = 2.0


def measure(lives: int, runs: int) -> Figures:
    figures: Figures = {"machine": machine()}
    with server() as (url, token):
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=token)
        from e2b import Sandbox  # reads nothing at import; imported here to keep the settings in one place

        with SandboxClient(url, token=token) as client:
            client.apply(DOCUMENTS)
            refilled(client, POOL, REPLICAS)

            def e2b_life() -> None:
                sandbox = Sandbox.create(template=POOL)
                sandbox.commands.run("true")
                sandbox.kill()

            def rollbox_life() -> None:
                sandbox = client.create_sandbox(warmpool=POOL)
                sandbox.commands.run("true")
                sandbox.delete()

            samples: dict[str, list[float]] = {}
            in_turns({"life_e2b": e2b_life, "life_rollbox": rollbox_life}, lives, samples,
                     before=lambda: refilled(client, POOL, REPLICAS))
            e2b_sandbox = Sandbox.create(template=POOL, timeout=600)
            rollbox_sandbox = client.create_sandbox(warmpool=POOL)
            runs_of: dict[str, Callable[[], object]] = {
                "run_true_e2b": lambda: e2b_sandbox.commands.run("true"),
                "run_true_rollbox": lambda: rollbox_sandbox.commands.run("true"),
                "run_bash_rollbox": lambda: rollbox_sandbox.commands.run(["/bin/bash", "-l", "-c", "true"])}
            try:
                in_turns(runs_of, runs, samples)
            finally:
                e2b_sandbox.kill()
                rollbox_sandbox.delete()
    figures.update({name: distribution(values) for name, values in samples.items()})
    figures["run_true_ratio"] = round(figures["run_true_e2b"]["p50"] / figures["run_true_rollbox"]["p50"], 2)
    figures["run_same_command_ratio"] = round(figures["run_true_e2b"]["p50"] / figures["run_bash_rollbox"]["p50"], 2)
    figures["machine"]["load_after"] = load()
    figures["missed"] = [name for name, met in (
        ("life_e2b", figures["life_e2b"]["p50"] <= LIFE_TARGET_MS),
        ("run_true_ratio", figures["run_true_ratio"] <= RUN_RATIO_TARGET)) if not met]
    return figures


def report(figures: Figures) -> Table:
    table = comparison("E2B's SDK against rollbox", figures, [
        ("create + run true + kill", "life", f"p50 <= {LIFE_TARGET_MS:g} ms (E2B)"),
        ("commands.run('true')", "run_true",
         f"E2B within {RUN_RATIO_TARGET:g}x rollbox (now {figures['run_true_ratio']}x)")], "e2b")
    value = figures["run_bash_rollbox"]
    table.add_row("commands.run(['/bin/bash', '-l', '-c', 'true'])", "rollbox", f"{value['p50']:.2f}",
                  f"{value['p99']:.2f}", str(value["n"]),
                  f"what E2B's SDK sends (E2B now {figures['run_same_command_ratio']}x)")
    return table


if __name__ == "__main__":
    main(__doc__, measure, report)
