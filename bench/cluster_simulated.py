"""The SIMULATED scale-out phases of bench/cluster.py: 20,000 live claims on 50 simulated nodes (simulated_node.py:
claims and warm pools in memory, no containers) behind one real router process (`rollbox serve --node URL` x 50).
What they measure is the router's own cost: its claims per second, its CPU per claim with few and with 20,000 live
claims, its memory per live claim, and a second router serving claims the first one made.

While they run, the router's event loop has a CPU of its own and the client and the simulated nodes share the other
(cpu.cpus_apart's lesson): the router is the process measured, so it is the one that must not wait for a CPU.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from clients import RawClient, timed
from cluster_processes import TOKEN, Child, router, rss_bytes, secret_file
from common import MB, Figures, distribution
from cpu import Tally, cpu_seconds
from pool import NAME, Control
from simulated_node import simulated_nodes

NODES = 50
LIVE = 20_000
"""Live claims at the top level: 400 per node."""
FEW = 100
"""Live claims at the bottom level."""
WARM_PER_NODE = 50
ROOM_PER_NODE = 640
"""Sandboxes a simulated node holds at most: its 400 claims, its share of the warm pool and a timed window's claims."""
CONCURRENCY = 64
PARTS = 4
"""Parts of a timed window: the router's CPU per claim at a level is its median part's, so that a burst of other
work on this shared machine (or on the host under it) during one part does not decide the comparison."""
PACE = 1000.0
"""Claims (and deletes) per second in the windows that compare the router's CPU per claim at FEW and at LIVE live
claims: well under what it serves, so that both are timed at the same rate. Back to back, its CPU per claim falls as
its rate rises (more requests per turn of its event loop), which hid what the live claims change."""
TRUE = ["true"]
DATA_PLANE = "python"
"""The targets here are the router process's own (claims per second through it, its CPU and memory per claim as
claims pile up), so every claim goes through it: at nginx's edge, warm claims would go straight to the nodes, and
nginx keeps nothing per claim (docs/cluster.md)."""


@dataclass(frozen=True)
class SimulatedPlan:
    window: int
    """Claims timed (then deleted, timed too) at each level of live claims."""
    warmup: int
    """Claims made and deleted before anything is timed: the router's connections to every node open meanwhile."""
    handoffs: int
    """Claims made through one router, then run in and deleted through the other."""


QUICK = SimulatedPlan(window=2560, warmup=1280, handoffs=64)
FULL = SimulatedPlan(window=6400, warmup=6400, handoffs=256)


def measure(root: Path, plan: SimulatedPlan, progress: Progress) -> Figures:
    secret = secret_file(root)
    with (simulated_nodes(NODES, ROOM_PER_NODE, secret.read_text()) as nodes,
          router(root, "router-simulated", nodes.urls, secret, DATA_PLANE) as first):
        figures = asyncio.run(phases(root, secret, nodes.urls, nodes.pid, first, plan, progress))
    few, live = figures["simulated_at_few"], figures["simulated_at_live"]
    figures["simulated_cpu_per_claim_ratio"] = round(live["claim_cpu_ms_median"] / few["claim_cpu_ms_median"], 3)
    figures["simulated_rss_per_live_claim_bytes"] = round(
        (live["router_rss_mb"] - few["router_rss_mb"]) * MB / (live["live"] - few["live"]), 1)
    return figures


async def phases(root: Path, secret: Path, urls: list[str], nodes: int, first: Child, plan: SimulatedPlan,
                 progress: Progress) -> Figures:
    control = Control(first.url, TOKEN)
    try:
        await control.apply(NODES * WARM_PER_NODE)
        figures = await scale(first, nodes, plan, progress)
        with router(root, "router-simulated-second", urls, secret, DATA_PLANE) as second:
            figures["simulated_handoffs"] = await handoffs(first, second, plan.handoffs, progress)
    finally:
        await control.close()
    return figures


async def scale(router: Child, nodes: int, plan: SimulatedPlan, progress: Progress) -> Figures:
    """Warm-up, then a timed window at FEW live claims, the fill to LIVE (the claims-per-second figure), and a
    timed window at LIVE, with the router's resident memory read at each level."""
    client = RawClient(router.url, TOKEN)
    mine = os.sched_getaffinity(0)
    figures: Figures = {}
    try:
        await client.connect(CONCURRENCY)
        cpus = sorted(mine)
        os.sched_setaffinity(nodes, {cpus[-1]})  # with the client, away from the router (cpus_apart's placement)
        warm: list[str] = []
        await claim_into(client, plan.warmup, Tally(None), warm, progress, "warm-up")
        await delete_all(client, warm, Tally(None), progress)
        held: list[str] = []
        await claim_into(client, FEW, Tally(None), held, progress, f"{FEW} live claims")
        figures["simulated_at_few"] = await level(client, router.pid, held, plan, progress)
        fill = Tally(router.pid, apart=True)
        spent = cpu_seconds(nodes)
        await claim_into(client, LIVE - FEW, fill, held, progress, f"fill to {LIVE} live claims")
        figures["simulated_claims"] = rate(fill, (cpu_seconds(nodes) - spent) * 1000 / (LIVE - FEW))
        figures["simulated_at_live"] = await level(client, router.pid, held, plan, progress)
    finally:
        os.sched_setaffinity(nodes, mine)
        await client.close()
    return figures


def rate(fill: Tally, nodes_cpu_ms: float) -> Figures:
    """The fill's figures, and what limited its rate: the router's share of its CPU (below 1, the other CPU, where
    the client and the simulated nodes run, was the limit) and the rate its CPU per claim allows a router that has a
    CPU of its own."""
    figures = fill.figures()
    return {**figures, "nodes_cpu_ms": round(nodes_cpu_ms, 3), "router_cpu_busy": round(fill.server_cpu / fill.wall, 3),
            "router_bound_per_s": round(1000 / figures["server_cpu_ms"])}


async def level(client: RawClient, router: int, held: list[str], plan: SimulatedPlan, progress: Progress) -> Figures:
    """The router's memory with `held` live claims, then a window of claims and their deletes sent at PACE per
    second, in PARTS, each part's claims timed on their own too."""
    rss = rss_bytes(router)
    fds = len(os.listdir(f"/proc/{router}/fd"))  # mostly its connections to the nodes
    claims, deletes = Tally(router, apart=True), Tally(router, apart=True)
    parts = []
    for part in range(PARTS):
        window: list[str] = []
        spent = claims.server_cpu
        await claim_into(client, plan.window // PARTS, claims, window, progress,
                         f"claims at {len(held)} live, part {part + 1} of {PARTS}", PACE)
        parts.append(round((claims.server_cpu - spent) * 1000 / len(window), 3))
        await delete_all(client, window, deletes, progress, PACE)
    return {"live": len(held), "router_rss_mb": round(rss / MB, 2), "router_fds": fds, "claim": claims.figures(),
            "delete": deletes.figures(), "claim_cpu_ms_parts": parts,
            "claim_cpu_ms_median": statistics.median(parts)}


async def claim_into(client: RawClient, count: int, tally: Tally, held: list[str], progress: Progress,
                     label: str, rate: float | None = None) -> None:
    async def claim(_: int) -> None:
        latency, handle = await timed(client.claim(NAME))
        tally.latencies.append(latency)
        held.append(handle)

    await concurrently(count, claim, tally, progress, f"SIMULATED nodes: {label}", rate)


async def delete_all(client: RawClient, handles: list[str], tally: Tally, progress: Progress,
                     rate: float | None = None) -> None:
    async def delete(index: int) -> None:
        latency, _ = await timed(client.delete(handles[index]))
        tally.latencies.append(latency)

    await concurrently(len(handles), delete, tally, progress, f"SIMULATED nodes: delete {len(handles)}", rate)


async def concurrently(count: int, step: Callable[[int], Awaitable[Any]], tally: Tally, progress: Progress,
                       label: str, rate: float | None = None) -> None:
    """`step(i)` for i in range(count), from CONCURRENCY clients, timed by `tally`: back to back, or step i started
    no sooner than i / `rate` seconds after the first."""
    task = progress.add_task(label, total=count)
    steps = iter(range(count))
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def worker() -> None:
        for index in steps:
            if rate is not None:
                await asyncio.sleep(start + index / rate - loop.time())
            await step(index)
            progress.advance(task)

    with tally.timing():
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def handoffs(first: Child, second: Child, count: int, progress: Progress) -> Figures:
    """`count` claims made through `first`, each then run in (`true`), deleted, and found gone, through `second`;
    a hand-off that fails anywhere counts as not served, by its error."""
    one, other = RawClient(first.url, TOKEN), RawClient(second.url, TOKEN)
    runs, deletes = Tally(None), Tally(None)
    failures: Counter[str] = Counter()

    async def handoff(_: int) -> None:
        try:
            handle = await one.claim(NAME)
            ran, (code, _) = await timed(other.run(handle, TRUE))
            deleted, _ = await timed(other.delete(handle))
            await one.call("GET", f"/v1/sandboxes/{handle}", None, 404)
        except (RuntimeError, OSError, asyncio.IncompleteReadError) as error:
            failures[str(error)[:200]] += 1
            return
        if code != 0:
            failures[f"true exited with {code}"] += 1
            return
        runs.latencies.append(ran)
        deletes.latencies.append(deleted)

    try:
        await concurrently(count, handoff, Tally(None), progress, "claims made through one router, served by another")
    finally:
        await one.close()
        await other.close()
    return {"requested": count, "served": len(runs.latencies), "failed": dict(failures),
            "exec_ms": distribution(runs.latencies) if runs.latencies else None,
            "delete_ms": distribution(deletes.latencies) if deletes.latencies else None}
