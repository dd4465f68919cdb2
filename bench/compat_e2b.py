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

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from common import Figures, distribution, load, machine, teardown, timed
from rollbox.client import SandboxClient
from rollbox.engine import Engine

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


@contextmanager
def server() -> Iterator[tuple[str, str]]:
    """A `rollbox serve` on a free loopback port, with one token; everything it made is gone afterwards."""
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-e2b-") as root, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        data, url = Path(root) / "data", f"http://127.0.0.1:{port}"
        log = (Path(root) / "serve.log").open("wb")
        process = subprocess.Popen([str(Path(sys.executable).with_name("rollbox")), "serve", "--data-dir", str(data),
                                    "--port", str(port), "--token", f"bench={token}", "--admin", "bench",
                                    "--delete-on-exit"],
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not _serving(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"rollbox serve did not come up: {(Path(root) / 'serve.log').read_text()}")
                time.sleep(0.05)
            yield url, token
        finally:
            process.terminate()
            process.wait(timeout=60)
            log.close()
            teardown(Engine(data))


def _serving(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz").status_code == 200
    except httpx.TransportError:
        return False


def refilled(client: SandboxClient) -> None:
    deadline = time.monotonic() + 60
    while client.get_warmpool(POOL).ready < REPLICAS:
        if time.monotonic() > deadline:
            raise RuntimeError("the warm pool did not refill in a minute")
        time.sleep(0.01)


def measure(lives: int, runs: int) -> Figures:
    figures: Figures = {"machine": machine()}
    with server() as (url, token):
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=token)
        from e2b import Sandbox  # reads nothing at import; imported here to keep the settings in one place

        with SandboxClient(url, token=token) as client:
            client.apply(DOCUMENTS)
            refilled(client)

            def e2b_life() -> None:
                sandbox = Sandbox.create(template=POOL)
                sandbox.commands.run("true")
                sandbox.kill()

            def rollbox_life() -> None:
                sandbox = client.create_sandbox(warmpool=POOL)
                sandbox.commands.run("true")
                sandbox.delete()

            samples: dict[str, list[float]] = {"life_e2b": [], "life_rollbox": [], "run_true_e2b": [],
                                               "run_true_rollbox": [], "run_bash_rollbox": []}
            for life in (e2b_life, rollbox_life):  # once each untimed: connections and imports warm
                refilled(client)
                life()
            for _ in range(lives):
                for name, life in (("life_e2b", e2b_life), ("life_rollbox", rollbox_life)):
                    refilled(client)
                    samples[name].append(timed(life))

            e2b_sandbox = Sandbox.create(template=POOL, timeout=600)
            rollbox_sandbox = client.create_sandbox(warmpool=POOL)
            runs_of: dict[str, Callable[[], object]] = {
                "run_true_e2b": lambda: e2b_sandbox.commands.run("true"),
                "run_true_rollbox": lambda: rollbox_sandbox.commands.run("true"),
                "run_bash_rollbox": lambda: rollbox_sandbox.commands.run(["/bin/bash", "-l", "-c", "true"])}
            try:
                for run in runs_of.values():
                    run()
                for _ in range(runs):
                    for name, run in runs_of.items():
                        samples[name].append(timed(run))
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
    m = figures["machine"]
    table = Table(title=f"E2B's SDK against rollbox ({m['cores']} cores, {m['memory_mb']} MB, kernel {m['kernel']}, "
                        f"runc {m['runc']}, load {m['load_before']} -> {m['load_after']})")
    for column in ("what", "SDK", "p50 ms", "p99 ms", "n", "target"):
        table.add_column(column)
    rows = [("create + run true + kill", "life", f"p50 <= {LIFE_TARGET_MS:g} ms (E2B)"),
            ("commands.run('true')", "run_true", f"E2B within {RUN_RATIO_TARGET:g}x rollbox "
                                                  f"(now {figures['run_true_ratio']}x)")]
    for what, prefix, target in rows:
        for sdk in ("e2b", "rollbox"):
            value = figures[f"{prefix}_{sdk}"]
            table.add_row(what, sdk, f"{value['p50']:.2f}", f"{value['p99']:.2f}", str(value["n"]),
                          target if sdk == "e2b" else "baseline")
    value = figures["run_bash_rollbox"]
    table.add_row("commands.run(['/bin/bash', '-l', '-c', 'true'])", "rollbox", f"{value['p50']:.2f}",
                  f"{value['p99']:.2f}", str(value["n"]),
                  f"what E2B's SDK sends (E2B now {figures['run_same_command_ratio']}x)")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 lives and 200 runs per SDK (not 100 and 1000)")
    args = parser.parse_args()
    start = time.perf_counter()
    figures = measure(30, 200) if args.quick else measure(100, 1000)
    figures["mode"] = "quick" if args.quick else "full"
    figures["elapsed_s"] = round(time.perf_counter() - start, 1)
    Console(width=160).print(report(figures))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
