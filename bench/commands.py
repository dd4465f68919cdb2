"""The phases of bench/server.py that run commands: `true` and python3 through the router, taking turns with the
engine, from several clients at once, in reused, isolated and fresh sandboxes; and the engine's own figures."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.progress import Progress

from clients import Client, release, succeed, timed, workers
from common import PYTHON, TEMPLATE, Figures, create_delete, distribution, python_throughput, repeat
from cpu import Tally
from plan import Plan
from pool import NAME, Control
from rollbox.engine import Container, Engine

TRUE = ["true"]


async def round_trips(clients: list[Client], box: Container, plan: Plan, server: int | None,
                      progress: Progress) -> Figures:
    """`true` one at a time straight into the engine (exec_async, as the server calls it) and through each
    client, taking turns: every path sees the same moments of a shared machine, so the differences are the
    router's and the SDK's own."""
    handles = [await client.claim(NAME) for client in clients]
    try:
        await box.exec_async(TRUE)
        for client, handle in zip(clients, handles, strict=True):
            await succeed(client, handle, TRUE)
        engine: list[float] = []
        tallies = [Tally(server) for _ in clients]
        task = progress.add_task(f"exec true: engine, {', '.join(c.label for c in clients)}", total=plan.execs)
        for _ in range(plan.execs):
            engine.append((await timed(box.exec_async(TRUE)))[0])
            for client, handle, tally in zip(clients, handles, tallies, strict=True):
                with tally.timing():
                    latency, _ = await timed(client.run(handle, TRUE))
                tally.latencies.append(latency)
            progress.advance(task)
    finally:
        await asyncio.gather(*(client.delete(handle) for client, handle in zip(clients, handles, strict=True)))
    return {"engine_exec_async_true_ms": distribution(engine),
            **{f"exec_true_{client.name}": tally.figures() for client, tally in zip(clients, tallies, strict=True)}}


async def loaded(client: Client, plan: Plan, server: int | None, progress: Progress) -> Figures:
    """`true`, then python3, from `workers` clients at once, each in a sandbox of its own."""
    boxes = [await client.claim(NAME) for _ in range(plan.workers)]
    try:
        await client.connect(plan.workers)
        tally = Tally(server)
        task = progress.add_task(f"exec true x {plan.workers} clients, {client.label}", total=plan.exec_load)

        async def each(box: Any) -> None:
            for _ in range(plan.exec_load // plan.workers):
                latency, _ = await timed(client.run(box, TRUE))
                tally.latencies.append(latency)
                progress.advance(task)

        with tally.timing():
            await asyncio.gather(*(each(box) for box in boxes))
        reused = await python_in(client, boxes, plan, server, progress, isolated=False)
        isolated = await python_in(client, boxes, plan, server, progress, isolated=True)
    finally:
        await release(client, boxes)
    return {f"exec_load_{client.name}": tally.figures(), f"python_reuse_{client.name}": reused,
            f"python_isolated_{client.name}": isolated}


async def python_in(client: Client, boxes: list[Any], plan: Plan, server: int | None, progress: Progress,
                    isolated: bool) -> Figures:
    """python3 from one client per sandbox: plainly (the engine benchmark's figure through the router), or as
    isolated commands, each in a throw-away copy of its sandbox (its own root, processes, IPC and loopback)."""
    tally = Tally(server)
    how = "isolated commands in" if isolated else "reusing"
    task = progress.add_task(f"{PYTHON} {how} {len(boxes)} sandboxes, {client.label}", total=plan.python)

    async def each(box: Any) -> None:
        for _ in range(plan.python // len(boxes)):
            latency, stdout = await timed(succeed(client, box, PYTHON, isolated))
            if stdout != "1\n":
                raise RuntimeError(f"{PYTHON} printed {stdout!r}")
            tally.latencies.append(latency)
            progress.advance(task)

    with tally.timing():
        await asyncio.gather(*(each(box) for box in boxes))
    return tally.figures()


async def python_fresh(client: Client, control: Control, plan: Plan, server: int | None,
                       progress: Progress) -> Figures:
    """Each python3 in a sandbox of its own: claim a warm one, run, delete; `workers` clients at once. Each
    part's p50 is kept too, to show where the run spends its time. The pool refills after the timing (a
    round takes at most 3/4 of it), so the creates behind the claims are not in this figure."""
    tally = Tally(server)
    parts: dict[str, list[float]] = {"claim": [], "exec": [], "delete": []}
    task = progress.add_task(f"{PYTHON} fresh sandbox x {plan.workers} clients, {client.label}", total=plan.python)

    async def step() -> None:
        start = time.perf_counter()
        claimed, handle = await timed(client.claim(NAME))
        ran, stdout = await timed(succeed(client, handle, PYTHON))
        deleted, _ = await timed(client.delete(handle))
        if stdout != "1\n":
            raise RuntimeError(f"{PYTHON} printed {stdout!r}")
        tally.latencies.append((time.perf_counter() - start) * 1000)
        for part, latency in zip(parts.values(), (claimed, ran, deleted), strict=True):
            part.append(latency)
        progress.advance(task)

    await control.settle()
    await client.connect(plan.workers)
    with tally.timing():
        await workers(plan.workers, plan.python // plan.workers, step)
    await control.settle()
    return {f"python_fresh_{client.name}": {
        **tally.figures(), **{f"{part}_p50": distribution(samples)["p50"] for part, samples in parts.items()}}}


def engine_direct(engine: Engine, plan: Plan, progress: Progress) -> Figures:
    """The engine's own figures on a data directory of its own, before the server starts (its async exec is
    timed later, taking turns with the router's)."""
    with engine.create(TEMPLATE) as box:
        box.exec(TRUE)
        sync = repeat(progress, "engine exec true", plan.execs, lambda: box.exec(TRUE))
    created = create_delete(engine, plan.creates, progress)
    python = python_throughput(engine, plan.python, plan.workers, progress)
    return {"engine_exec_true_ms": distribution(sync), "engine_create_ms": created["create_ms"],
            "engine_delete_ms": created["delete_ms"], "engine_python_per_s": python["python_per_s"],
            "engine_python_ms": python["python_ms"]}
