"""What bench/compat_e2b.py and bench/compat_agent_sandbox.py share: a `rollbox serve` on a loopback port (the
compatible clients speak TCP only), a warm pool let refill between timed claims, calls timed in turns so that both
clients meet the same moments of a shared machine, and the table that sets each client beside rollbox's SDK."""

from __future__ import annotations

import argparse
import json
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

from common import Figures, teardown, timed
from rollbox.client import SandboxClient
from rollbox.engine import Engine

ROLLBOX = Path(sys.executable).with_name("rollbox")


@contextmanager
def server() -> Iterator[tuple[str, str]]:
    """A `rollbox serve` on a free loopback port, with one token; everything it made is gone afterwards."""
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-compat-") as root, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        data, url = Path(root) / "data", f"http://127.0.0.1:{port}"
        log = (Path(root) / "serve.log").open("wb")
        process = subprocess.Popen([str(ROLLBOX), "serve", "--data-dir", str(data), "--port", str(port),
                                    "--token", f"bench={token}", "--admin", "bench", "--delete-on-exit"],
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


def refilled(client: SandboxClient, pool: str, replicas: int) -> None:
    """Waits until the warm pool is full again, so that the next claim is a warm one."""
    deadline = time.monotonic() + 60
    while client.get_warmpool(pool).ready < replicas:
        if time.monotonic() > deadline:
            raise RuntimeError("the warm pool did not refill in a minute")
        time.sleep(0.01)


def in_turns(calls: dict[str, Callable[[], object]], count: int, samples: dict[str, list[float]],
             before: Callable[[], object] = lambda: None) -> None:
    """Each call once untimed (connections and imports warm), then `count` rounds of all of them in turn, each
    timed into `samples[name]` after `before` (untimed)."""
    for call in calls.values():
        before()
        call()
    for _ in range(count):
        for name, call in calls.items():
            before()
            samples.setdefault(name, []).append(timed(call))


def comparison(title: str, figures: Figures, rows: list[tuple[str, str, str]], client: str) -> Table:
    """A row per (what, figure prefix, target) for `client` and one for rollbox's SDK, its baseline."""
    m = figures["machine"]
    table = Table(title=f"{title} ({m['cores']} cores, {m['memory_mb']} MB, kernel {m['kernel']}, runc {m['runc']}, "
                        f"load {m['load_before']} -> {m['load_after']})")
    for column in ("what", "client", "p50 ms", "p99 ms", "n", "target"):
        table.add_column(column)
    for what, prefix, target in rows:
        for side in (client, "rollbox"):
            value = figures[f"{prefix}_{side}"]
            table.add_row(what, side.replace("_", "-"), f"{value['p50']:.2f}", f"{value['p99']:.2f}", str(value["n"]),
                          target if side == client else "baseline")
    return table


def main(doc: str, measure: Callable[[int, int], Figures], report: Callable[[Figures], Table]) -> None:
    """The command line of a compat bench: `--quick` takes 30 claims and 200 runs per client (not 100 and 1000)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 claims and 200 runs per client (not 100 and 1000)")
    args = parser.parse_args()
    start = time.perf_counter()
    figures = measure(30, 200) if args.quick else measure(100, 1000)
    figures["mode"] = "quick" if args.quick else "full"
    figures["elapsed_s"] = round(time.perf_counter() - start, 1)
    Console(width=160).print(report(figures))
    print(json.dumps(figures))
