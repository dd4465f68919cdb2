"""The claim phases of bench/server.py: warm claims, claims amid an RL step's turnover, a burst, and the HTTP floor
they are measured against."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from rich.progress import Progress

import http_floor
from clients import MAX_CONNECTIONS, Client, RawClient, bounded, release, timed, workers
from common import Figures
from cpu import Tally
from plan import CONCURRENCY, Plan, turnover_clients
from pool import NAME, Control, cold_claims
from rollbox.errors import RollboxError

CURVES: dict[str, tuple[str, list[float]]] = {}
"""The claim phases' samples (the HTTP floor's too) by figure name, with their legend label, for --plot."""


def plotted(tally: Tally, name: str, label: str) -> Figures:
    """The figures of a claim phase, its samples kept in CURVES under `name` for --plot (`label` in its legend)."""
    CURVES[name] = (label, tally.latencies)
    return tally.figures()


async def claim_round(client: Client, tally: Tally, concurrency: int, size: int, progress: Progress,
                      task: Any) -> None:
    """`size` warm claims by `concurrency` clients, checked for cold starts, then released."""
    held: list[tuple[Any, float, float]] = []

    async def step() -> None:
        sent = time.perf_counter()
        latency, handle = await timed(client.claim(NAME))
        held.append((handle, sent, latency))
        progress.advance(task)

    await client.connect(concurrency)
    with tally.timing():
        await workers(concurrency, size // concurrency, step)
    flags = await cold_claims(client, [(handle, sent) for handle, sent, _ in held])
    for (_, _, latency), cold in zip(held, flags, strict=True):
        (tally.cold if cold else tally.latencies).append(latency)
    await release(client, [handle for handle, _, _ in held])


async def warm_claims(client: Client, control: Control, plan: Plan, server: int | None,
                      progress: Progress) -> Figures:
    """Warm claims at each concurrency with the client and the server's loop on CPUs of their own, then, for an
    embedded server, at the highest again as the scheduler places them (`claim_c64_shared`), to show what sharing
    the machine's cores costs (a remote router shares none with this client)."""
    figures = {}
    passes = [(concurrency, True) for concurrency in CONCURRENCY]
    if server is not None:
        passes.append((CONCURRENCY[-1], False))
    for concurrency, apart in passes:
        tally = Tally(server, apart)
        left = max(plan.claims, concurrency) // concurrency * concurrency
        shared = "" if apart else ", CPUs shared"
        task = progress.add_task(f"claim x {concurrency} concurrent{shared}, {client.label}", total=left)
        while left > 0:
            size = min(left, max(concurrency, plan.round // concurrency * concurrency))
            await control.settle()
            await claim_round(client, tally, concurrency, size, progress, task)
            left -= size
        name = f"claim_c{concurrency}{'' if apart else '_shared'}_{client.name}"
        clients = f"{concurrency} client{'' if concurrency == 1 else 's'}"
        where = ", CPUs shared" if not apart else ", a CPU each" if concurrency == CONCURRENCY[-1] else ""
        figures[name] = plotted(tally, name, clients + where)
    await control.settle()
    return figures


async def turnover(client: Client, control: Control, plan: Plan, server: int | None, progress: Progress) -> Figures:
    """An RL step's turnover: each client lets go of the sandbox it holds, claims a new one and runs a command in
    it (which tells a warm sandbox from a cold start), all at once, so that the claims meet the deletions just
    asked for and the refill of the pool they drain. The warm-claim phase settles the node before every round
    and so times claims alone; this is what a trainer meets between two steps. The latency is the claim's; rate
    and CPU are per step (delete, claim, command). The node settles between rounds, which end before the pool
    runs dry."""
    concurrency = turnover_clients(plan)
    steps = max(1, plan.pool // concurrency - 2)
    rounds = max(1, plan.claims // (steps * concurrency))
    tally = Tally(server)
    task = progress.add_task(f"claim x {concurrency} clients, each after a delete, {client.label}",
                             total=rounds * steps * concurrency)

    async def worker(handle: Any) -> Any:
        for _ in range(steps):
            await client.delete(handle)
            sent = time.perf_counter()
            latency, handle = await timed(client.claim(NAME))
            [cold] = await cold_claims(client, [(handle, sent)])
            (tally.cold if cold else tally.latencies).append(latency)
            progress.advance(task)
        return handle

    await client.connect(concurrency)
    for _ in range(rounds):
        await control.settle()
        held = await bounded([client.claim(NAME) for _ in range(concurrency)])
        with tally.timing():
            held = await asyncio.gather(*(worker(handle) for handle in held))
        await release(client, held)
    await control.settle()
    name = f"claim_turnover_{client.name}"
    return {name: {**plotted(tally, name, "turnover (claim right after a delete)"), "clients": concurrency}}

async def floor_claims(plan: Plan, progress: Progress, unix: bool) -> Figures:
    """The raw client's claim request at 64 clients, answered by http_floor's constant app instead of the router,
    on a loopback port or a unix socket."""
    concurrency = CONCURRENCY[-1]
    size = max(4 * plan.claims, concurrency) // concurrency * concurrency  # a constant answer is quick: more of them
    with http_floor.serving(unix) as (url, pid):
        client = RawClient(url, None)
        tally = Tally(pid, apart=True)
        task = progress.add_task(f"constant answers x {concurrency} concurrent, {client.label}", total=size)

        async def step() -> None:
            latency, _ = await timed(client.call("POST", "/v1/sandboxes", {"warmpool": NAME}, 200))
            tally.latencies.append(latency)
            progress.advance(task)

        try:
            await client.connect(concurrency)
            with tally.timing():
                await workers(concurrency, size // concurrency, step)
        finally:
            await client.close()
    name = f"http_floor{'_unix' if unix else ''}_c{concurrency}_raw"
    label = f"HTTP floor (constant answer, {'unix socket' if unix else 'loopback TCP'})"
    return {name: plotted(tally, name, label)}


async def burst(client: Client, control: Control, plan: Plan, server: int | None, progress: Progress) -> Figures:
    """`plan.burst` claims sent at once against a full pool of as many; latency counts from the burst's start
    (so it includes waiting for one of the client's connections)."""
    tally = Tally(server)
    failures: Counter[str] = Counter()
    served: list[tuple[Any, float]] = []
    task = progress.add_task(f"burst of {plan.burst} claims, {client.label}", total=plan.burst)

    async def one() -> None:
        try:
            handle = await client.claim(NAME)
        except (RollboxError, RuntimeError, OSError, asyncio.IncompleteReadError) as error:
            failures[getattr(error, "code", type(error).__name__)] += 1
        else:
            served.append((handle, start))
            tally.latencies.append((time.perf_counter() - start) * 1000)
        progress.advance(task)

    await control.settle()
    await client.connect(min(plan.burst, MAX_CONNECTIONS))
    with tally.timing():
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(plan.burst)))
    flags = await cold_claims(client, served)
    figures = {**tally.figures(), "requested": plan.burst, "cold": sum(flags), "failed": dict(failures),
               "wall_s": round(tally.wall, 2)}
    await release(client, [handle for handle, _ in served])
    return {f"burst_{client.name}": figures}
