"""Server benchmark: warm claims, exec and isolated python3 through the HTTP router, beside the engine's own figures.

Run as root: `.venv/bin/python bench/server.py [--quick] [--plot PNG]`. Without ROLLBOX_URL it starts
`rollbox serve` in a child process (its own interpreter and CPU time), on a unix socket as the embedded default
does, with a throw-away data directory, and removes everything it made; with ROLLBOX_URL (and ROLLBOX_TOKEN), as
`rollbox bench` sets them, it measures that router instead. Either way it applies a template and a warm pool of
its own, and also times the engine directly on a data directory of its own, so that the router's overhead shows
as a difference. First it times the raw client's claim request against bench/http_floor.py, a constant answer
from a bare ASGI app on uvicorn, over loopback TCP and over a unix socket: the floor of any Python HTTP answer on
this machine at that moment, beside which the warm claims show the router's own share (this machine's speed
varies from hour to hour). Those two phases time the request path alone: while they are timed, the client and
the embedded server's event loop run on CPUs of their own (see cpu.cpus_apart), and the 64-client warm claim runs
once more with the two sharing the CPUs as the scheduler places them.

Every phase runs through two clients: the SDK's AsyncSandboxClient (the product path) and a raw
HTTP/1.1 keep-alive client (sockets and hand-written requests, the floor of what a client costs). It prints a
table and, as its last line, one JSON object of every figure: latencies p50/p99 in milliseconds, rates per
second, CPU milliseconds per operation of the server process and of this one (the embedded server only).

This script runs the phases in order; they live beside it: the clients in clients.py, the warm pool in pool.py,
the claim phases in claims.py, the command phases in commands.py, CPU time and pinning in cpu.py, the table in
report.py, and what all benchmarks share in common.py. With the embedded server, a last phase times warm claims and
`exec true` with tracing off and on, in alternating rounds against two servers (tracing_cost.py; `--tracing-only`
runs it alone, `--baseline-src DIR` adds a server of older code).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import Progress

from claim_plot import plot_claims
from claims import CURVES, burst, floor_claims, turnover, warm_claims
from clients import Client, RawClient, SdkClient
from commands import engine_direct, loaded, python_fresh, round_trips
from common import TEMPLATE, Figures, load, machine, progress_bars, teardown, throwaway_engine
from cpu import server_pid
from plan import FULL, QUICK, Plan, room
from pool import Control
from report import missed, table
from rollbox._signals import exit_on_sigterm
from rollbox.engine import Container, Engine
from rollbox.server.local import LocalServer
from tracing_cost import tracing_overhead


@contextlib.contextmanager
def router(plan: Plan) -> Iterator[tuple[str, str | None, int | None]]:
    """ROLLBOX_URL's router, or an embedded one with room for a burst and a full pool behind it."""
    url = os.environ.get("ROLLBOX_URL")
    if url:
        yield url, os.environ.get("ROLLBOX_TOKEN"), None
        return
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-server-") as root:
        data = Path(root) / "data"
        try:
            with LocalServer(data, max_sandboxes=room(plan)) as server:
                yield server.url, None, server_pid()
        finally:
            teardown(Engine(data))


async def through_router(url: str, token: str | None, plan: Plan, server: int | None, box: Container,
                         progress: Progress) -> Figures:
    """Each phase with the raw client, then the SDK, so both see the same machine moments apart."""
    control = Control(url, token)
    clients: list[Client] = [RawClient(url, token), SdkClient(url, token)]
    figures: Figures = {}
    try:
        await control.require_room(max(plan.pool, plan.burst), room(plan))
        for unix in (False, True):
            figures.update(await floor_claims(plan, progress, unix))
        await control.apply(plan.pool)
        for phase in (warm_claims, turnover, python_fresh):
            for client in clients:
                figures.update(await phase(client, control, plan, server, progress))
        figures.update(await round_trips(clients, box, plan, server, progress))
        for client in clients:
            figures.update(await loaded(client, plan, server, progress))
        await control.apply(plan.burst)
        for client in clients:
            figures.update(await burst(client, control, plan, server, progress))
    finally:
        for client in clients:
            await client.close()
        await control.close()
    return figures


def measure(plan: Plan, baseline: Path | None, tracing_only: bool) -> Figures:
    figures: Figures = {"machine": machine()}
    if tracing_only:
        figures["machine"]["server"] = "embedded, unix"
        with progress_bars() as progress:
            figures.update(asyncio.run(tracing_overhead(plan, progress, baseline)))
        figures["machine"]["load_after"] = load()
        figures["missed"] = missed(figures)
        return figures
    with progress_bars() as progress, throwaway_engine() as engine:
        figures.update(engine_direct(engine, plan, progress))
        with engine.create(TEMPLATE) as box, router(plan) as (url, token, server):
            figures["machine"]["server"] = url if server is None else f"embedded, {urlsplit(url).scheme}"
            figures.update(asyncio.run(through_router(url, token, plan, server, box, progress)))
        if "ROLLBOX_URL" not in os.environ:
            figures.update(asyncio.run(tracing_overhead(plan, progress, baseline)))
    figures["router_exec_overhead_ms"] = round(
        figures["exec_true_raw"]["p50"] - figures["engine_exec_async_true_ms"]["p50"], 3)
    figures["sdk_exec_overhead_ms"] = round(figures["exec_true_sdk"]["p50"] - figures["exec_true_raw"]["p50"], 3)
    figures["machine"]["load_after"] = load()
    figures["missed"] = missed(figures)
    return figures


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"fewer samples and a burst of {QUICK.burst} claims (not {FULL.burst}): under a minute")
    parser.add_argument("--plot", type=Path, metavar="PNG",
                        help="also draw the claim phases' latency distributions, a panel per client, into PNG")
    parser.add_argument("--tracing-only", action="store_true",
                        help="only the tracing phase: claims and execs with tracing off and on (bench/tracing_cost.py)")
    parser.add_argument("--baseline-src", type=Path, metavar="DIR",
                        help="a checkout of rollbox before tracing: the tracing phase also runs a server of that code")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    start = time.perf_counter()
    figures = measure(plan, args.baseline_src, args.tracing_only)
    figures["mode"] = "quick" if args.quick else "full"
    figures["plan"] = {"pool": plan.pool, "workers": plan.workers, "burst": plan.burst}
    figures["elapsed_s"] = round(time.perf_counter() - start, 1)
    Console(width=200).print(table(figures, plan))
    if args.plot:
        m = figures["machine"]
        plot_claims(CURVES, args.plot,
                    f"rollbox warm claims ({figures['mode']}), {m['cores']} cores, Linux {m['kernel']}, "
                    f"server {m['server']}")
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
