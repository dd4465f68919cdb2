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
the embedded server's event loop run on CPUs of their own (see cpus_apart), and the 64-client warm claim runs
once more with the two sharing the CPUs as the scheduler places them.

Every phase runs through two clients: the SDK's AsyncSandboxClient (the product path) and a raw
HTTP/1.1 keep-alive client (sockets and hand-written requests, the floor of what a client costs). It prints a
table and, as its last line, one JSON object of every figure: latencies p50/p99 in milliseconds, rates per
second, CPU milliseconds per operation of the server process and of this one (the embedded server only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import http_floor
from claim_plot import plot_claims
from common import (
    PYTHON,
    TEMPLATE,
    Figures,
    create_delete,
    distribution,
    load,
    machine,
    progress_bars,
    python_throughput,
    repeat,
    teardown,
    throwaway_engine,
)
from rollbox._signals import exit_on_sigterm
from rollbox.client import AsyncSandboxClient
from rollbox.client._http import DEFAULT_TIMEOUT, Settings
from rollbox.engine import Container, Engine
from rollbox.errors import RollboxError
from rollbox.server.local import LocalServer

NAME = "rollbox-bench"
"""The template and the warm pool this benchmark applies (and deletes at the end)."""
TRUE = ["true"]
AGE = "cat /proc/uptime /proc/1/stat"
TICKS = os.sysconf("SC_CLK_TCK")
CONCURRENCY = (1, 16, 64)
MAX_CONNECTIONS = 256
"""Connections each client opens at most: the SDK's default, so a burst queues the same way in both."""
SETTLE_TIMEOUT = 300.0
CURVES: dict[str, tuple[str, list[float]]] = {}
"""The claim phases' samples (the HTTP floor's too) by figure name, with their legend label, for --plot."""


def resources(replicas: int) -> str:
    return f"""
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {{name: {NAME}}}
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {{name: {NAME}}}
spec: {{replicas: {replicas}, refillConcurrency: 4, sandboxTemplateRef: {{name: {NAME}}}}}
"""


@dataclass(frozen=True)
class Plan:
    """Samples per phase and client: `--quick` keeps the whole run under a minute."""

    pool: int
    """Replicas of the warm pool behind the claim, exec and python phases; a round leaves more than a quarter
    of it, so the pool never runs low enough to refill (and compete for the CPU) while a round is timed."""
    claims: int
    execs: int
    exec_load: int
    python: int
    burst: int
    creates: int
    """Engine create + delete samples: what a cold claim, a refill and the clean-up after an isolated run cost."""
    workers: int
    """Concurrent clients in the throughput phases."""

    @property
    def round(self) -> int:
        """The most claims a round takes (the pool refills at once at a quarter or less)."""
        return self.pool - self.pool // 4 - 1


QUICK = Plan(pool=100, claims=32, execs=200, exec_load=400, python=32, burst=100, creates=10, workers=8)
FULL = Plan(pool=260, claims=576, execs=1000, exec_load=2000, python=192, burst=1000, creates=50, workers=8)


TARGETS: dict[str, tuple[str, Callable[[Figures], bool]]] = {
    "claim_c64": ("p50 <= 5, p99 <= 25 ms", lambda m: m["p50"] <= 5 and m["p99"] <= 25),
    "exec_true": ("p50 <= 4 ms", lambda m: m["p50"] <= 4),
    "exec_load": (">= 400/s", lambda m: m["per_s"] >= 400),
    "python_isolated": (">= 60/s", lambda m: m["per_s"] >= 60),
    "burst": ("all served, p99 <= 1 s", lambda m: m["n"] == m["requested"] and m["p99"] <= 1000),
}
"""Issue 3 item 9's targets by phase, each client's figure held to them: reported, not asserted."""


def missed(figures: Figures) -> list[str]:
    """Figures under their target; one with nothing measured (every call failed) is under it."""
    return [name for name, value in figures.items() if name.rpartition("_")[0] in TARGETS
            and not (value["n"] and TARGETS[name.rpartition("_")[0]][1](value))]


# -- the two clients --------------------------------------------------------------------------

class Client(Protocol):
    """What the phases need of a client; a handle is whatever the client holds for a claimed sandbox."""

    name: str
    label: str

    async def claim(self, pool: str) -> Any: ...

    async def run(self, handle: Any, command: str | list[str], isolated: bool = False) -> tuple[int | None, str]: ...

    async def delete(self, handle: Any) -> None: ...

    async def connect(self, count: int) -> None:
        """Opens `count` connections, so that no timed call pays for one."""

    async def close(self) -> None: ...


class SdkClient:
    name = "sdk"
    label = "SDK (AsyncSandboxClient)"

    def __init__(self, url: str, token: str | None) -> None:
        self.client = AsyncSandboxClient(url, token, max_connections=MAX_CONNECTIONS)

    async def claim(self, pool: str) -> Any:
        return await self.client.create_sandbox(warmpool=pool)

    async def run(self, handle: Any, command: str | list[str], isolated: bool = False) -> tuple[int | None, str]:
        result = await handle.run(command, isolated=isolated)
        return result.exit_code, result.stdout

    async def delete(self, handle: Any) -> None:
        await handle.delete()

    async def connect(self, count: int) -> None:
        await asyncio.gather(*(self.client.health() for _ in range(count)))

    async def close(self) -> None:
        await self.client.close()


class RawConnection:
    """One keep-alive HTTP/1.1 connection; answers must carry a content-length (the router's do)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"transfer-encoding":
                raise RuntimeError("the raw client reads only answers with a content-length")
        return int(lines[0].split(b" ", 2)[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


class RawClient:
    """Requests written by hand over a few kept-alive sockets: what the router answers with no client overhead."""

    name = "raw"
    label = "raw HTTP/1.1 keep-alive"

    def __init__(self, url: str, token: str | None) -> None:
        settings = Settings(url, token, DEFAULT_TIMEOUT)
        self.socket = settings.socket
        parts = urlsplit(settings.origin)
        if parts.scheme != "http" or parts.hostname is None:
            raise RuntimeError(f"{url}: the raw client speaks plain http only")
        self.host, self.port = parts.hostname, parts.port or 80
        auth = f"authorization: Bearer {token}\r\n" if token else ""
        self.headers = f"host: {parts.netloc}\r\n{auth}content-type: application/json\r\n"
        self.idle: list[RawConnection] = []
        self.slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def call(self, method: str, path: str, body: object, expect: int) -> bytes:
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\n{self.headers}content-length: {len(payload)}\r\n\r\n".encode()
        async with self.slots:
            connection = await self.connection()
            try:
                status, answer = await connection.request(head, payload)
            except BaseException:
                connection.close()
                raise
            self.idle.append(connection)
        if status != expect:
            raise RuntimeError(f"{method} {path} answered {status}: {answer[:300]!r}")
        return answer

    async def connection(self) -> RawConnection:
        """An idle connection the server has not closed (it does after 75 s idle), else a new one."""
        while self.idle:
            connection = self.idle.pop()
            if not connection.reader.at_eof():
                return connection
            connection.close()
        if self.socket is not None:
            return RawConnection(*await asyncio.open_unix_connection(self.socket))
        return RawConnection(*await asyncio.open_connection(self.host, self.port))

    async def claim(self, pool: str) -> Any:
        return json.loads(await self.call("POST", "/v1/sandboxes", {"warmpool": pool}, 201))["id"]

    async def run(self, handle: Any, command: str | list[str], isolated: bool = False) -> tuple[int | None, str]:
        body = {"command": command, "isolated": True} if isolated else {"command": command}
        result = json.loads(await self.call("POST", f"/v1/sandboxes/{handle}/exec", body, 200))
        return result["exit_code"], result["stdout"]

    async def delete(self, handle: Any) -> None:
        await self.call("DELETE", f"/v1/sandboxes/{handle}", None, 204)

    async def connect(self, count: int) -> None:
        await asyncio.gather(*(self.call("GET", "/healthz", None, 200) for _ in range(count)))

    async def close(self) -> None:
        for connection in self.idle:
            connection.close()


# -- counting -----------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """CPU time of all of a process's threads, to the nanosecond (/proc's 10 ms ticks are too coarse for a
    50 ms burst): the kernel's CPU-time clock of that process, whose id clock_getcpuclockid(3) would give."""
    return time.clock_gettime(((~pid) << 3) | 2)


@contextlib.contextmanager
def cpus_apart(server: int) -> Iterator[None]:
    """Runs the server's event loop (its main thread) on one CPU and this client's on another, then puts back
    what both had (threads the server started meanwhile get its main thread's CPUs).

    Two processes answering each other over a socket wake each other with a hint that the waker is about to
    sleep, and Linux then runs the one woken on the waker's CPU: on two cores the server and a client that
    keeps 64 requests in flight end up sharing one for much of a round of claims, which halves the rate at
    random from round to round. A client on a machine of its own never shares the server's CPU; this is the
    nearest a single machine comes to that."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield
        return
    theirs = {thread: os.sched_getaffinity(thread) for thread in threads(server)}
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(server, {cpus[0]})
    os.sched_setaffinity(0, {cpus[1]})
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)
        for thread in threads(server):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(thread, theirs.get(thread, theirs[server]))


def threads(pid: int) -> list[int]:
    """The ids of a process's threads: none once it has ended."""
    try:
        return [int(thread) for thread in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def server_pid() -> int | None:
    """The embedded server: LocalServer's only child of ours that runs `rollbox.server`."""
    me = os.getpid()
    for pid in Path(f"/proc/{me}/task/{me}/children").read_text().split():
        with contextlib.suppress(OSError):
            if b"rollbox.server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    return None


@dataclass
class Tally:
    """One measurement's latencies, and the wall and CPU time of both sides spent while timing only."""

    server: int | None
    apart: bool = False
    """Time with the client and the server's event loop on CPUs of their own (see cpus_apart): for the phases
    that time the request path alone, when the server is embedded."""
    latencies: list[float] = field(default_factory=list)
    cold: list[float] = field(default_factory=list)
    wall: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    load: float | None = None
    """The 1-minute load average when timing first started: others may be running tests on this machine."""

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        self.load = os.getloadavg()[0] if self.load is None else self.load
        wall, client = time.perf_counter(), time.process_time()
        server = cpu_seconds(self.server) if self.server else 0.0
        with cpus_apart(self.server) if self.apart and self.server else contextlib.nullcontext():
            yield
        self.wall += time.perf_counter() - wall
        self.client_cpu += time.process_time() - client
        self.server_cpu += cpu_seconds(self.server) - server if self.server else 0.0

    def figures_kept_as(self, name: str, label: str) -> Figures:
        """The figures of a claim phase, its samples kept under `name` for --plot (`label` in its legend)."""
        CURVES[name] = (label, self.latencies)
        return self.figures()

    def figures(self) -> Figures:
        count = len(self.latencies) + len(self.cold)
        per_op = 1000 / max(count, 1)
        latencies = distribution(self.latencies) if self.latencies else {"p50": None, "p99": None, "n": 0}
        return {**latencies, "per_s": round(count / self.wall, 1),
                "client_cpu_ms": round(self.client_cpu * per_op, 3),
                "server_cpu_ms": round(self.server_cpu * per_op, 3) if self.server else None,
                "cold": len(self.cold), "cold_p50": distribution(self.cold)["p50"] if self.cold else None,
                "load": round(self.load or 0.0, 2), "cpus_apart": bool(self.apart and self.server)}


async def timed(action: Awaitable[Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await action
    return (time.perf_counter() - start) * 1000, result


async def workers(count: int, each: int, step: Callable[[], Awaitable[None]]) -> None:
    """`count` concurrent clients, each doing `step` `each` times in a row."""
    async def worker() -> None:
        for _ in range(each):
            await step()

    await asyncio.gather(*(worker() for _ in range(count)))


async def bounded(actions: list[Awaitable[Any]], limit: int = 64) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(action: Awaitable[Any]) -> Any:
        async with gate:
            return await action

    return await asyncio.gather(*(one(action) for action in actions))


async def succeed(client: Client, handle: Any, command: str | list[str], isolated: bool = False) -> str:
    code, stdout = await client.run(handle, command, isolated)
    if code != 0:
        raise RuntimeError(f"{command!r} exited with {code} in sandbox {handle}")
    return stdout


# -- the router: pool state ------------------------------------------------------------------

class Control:
    """Applies the pool and waits for the node to be idle, through the SDK; never timed."""

    def __init__(self, url: str, token: str | None) -> None:
        self.client = AsyncSandboxClient(url, token)

    async def apply(self, replicas: int) -> None:
        await self.client.apply(resources(replicas))
        await self.settle()

    async def require_room(self, replicas: int, embedded: int) -> None:
        """Fails at once, not after SETTLE_TIMEOUT, on a node too small for a warm pool of `replicas`."""
        most = (await self.client.health()).max_sandboxes
        if most is not None and most < replicas:
            raise SystemExit(f"the node runs {most} sandboxes at most and this benchmark's warm pool needs "
                             f"{replicas}: restart the server with --max-sandboxes {embedded}, as the embedded one "
                             "gets")

    async def settle(self) -> None:
        """Waits until the pool is full and no sandbox is starting or being deleted anywhere on the node."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            health = await self.client.health()
            pools = health.pools.values()
            mine = health.pools[NAME]
            if (mine["ready"] >= mine["replicas"] and not any(pool["starting"] for pool in pools)
                    and health.sandboxes == health.claims + sum(pool["ready"] for pool in pools)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node did not settle in {SETTLE_TIMEOUT:.0f} s: {health}")
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        with contextlib.suppress(RollboxError):
            await self.client.delete_warmpool(NAME)
            await self.client.delete_template(NAME)
        await self.client.close()


async def cold_claims(client: Client, claims: list[tuple[Any, float]]) -> list[bool]:
    """Which claims got a sandbox whose pid 1 started after the claim was sent (10 ms resolution): a cold
    start, where a warm one was started before. Read inside the sandbox, so it holds for a remote router too."""
    async def cold(handle: Any, sent: float) -> bool:
        out = await succeed(client, handle, AGE)
        checked = time.perf_counter()
        uptime, stat = out.splitlines()[:2]
        age = float(uptime.split()[0]) - int(stat.rpartition(")")[2].split()[19]) / TICKS
        return age < checked - sent

    return await bounded([cold(handle, sent) for handle, sent in claims], 16)


async def release(client: Client, handles: list[Any]) -> None:
    await bounded([client.delete(handle) for handle in handles])


# -- phases -----------------------------------------------------------------------------------

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
        figures[name] = tally.figures_kept_as(name, clients + where)
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
    return {name: {**tally.figures_kept_as(name, "turnover (claim right after a delete)"), "clients": concurrency}}


def turnover_clients(plan: Plan) -> int:
    """Clients of the turnover phase: 64, or fewer for a pool too small to serve two steps of them and more."""
    return min(CONCURRENCY[-1], plan.pool // 3)


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
    return {name: tally.figures_kept_as(name, label)}


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


# -- the run ----------------------------------------------------------------------------------

def room(plan: Plan) -> int:
    """Sandboxes the embedded node may run: a full pool behind the burst, the burst's claims and 64 more."""
    return 2 * plan.burst + 64


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


def measure(plan: Plan) -> Figures:
    figures: Figures = {"machine": machine()}
    with progress_bars() as progress, throwaway_engine() as engine:
        figures.update(engine_direct(engine, plan, progress))
        with engine.create(TEMPLATE) as box, router(plan) as (url, token, server):
            figures["machine"]["server"] = url if server is None else f"embedded, {urlsplit(url).scheme}"
            figures.update(asyncio.run(through_router(url, token, plan, server, box, progress)))
    figures["router_exec_overhead_ms"] = round(
        figures["exec_true_raw"]["p50"] - figures["engine_exec_async_true_ms"]["p50"], 3)
    figures["sdk_exec_overhead_ms"] = round(figures["exec_true_sdk"]["p50"] - figures["exec_true_raw"]["p50"], 3)
    figures["machine"]["load_after"] = load()
    figures["missed"] = missed(figures)
    return figures


# -- report -----------------------------------------------------------------------------------

def describe(name: str, plan: Plan) -> tuple[str, str]:
    """What a figure measures, and through which client."""
    workers = plan.workers
    engine = {"engine_exec_true_ms": "exec true (sync, as bench/engine.py)",
              "engine_exec_async_true_ms": "exec true (exec_async, as the server), in turns",
              "engine_create_ms": "create a sandbox", "engine_delete_ms": "delete a sandbox",
              "engine_python_ms": f"python3 print(1), {workers} threads, a sandbox each",
              "engine_python_per_s": f"python3 print(1), {workers} threads, a sandbox each"}
    if name in engine:
        return engine[name], "engine"
    what, _, client = name.rpartition("_")
    phases = {"exec_true": "exec true, 1 client, in turns with engine",
              "exec_load": f"exec true, {workers} clients, a sandbox each",
              "python_reuse": f"python3 print(1), {workers} clients, a sandbox each",
              "python_isolated": f"python3 print(1) as isolated commands, {workers} clients, a sandbox each",
              "python_fresh": f"python3 print(1), a fresh sandbox each (claim, exec, delete), {workers} clients",
              "burst": f"burst of {plan.burst} claims, pool of {plan.burst}",
              **{f"claim_c{c}": f"warm claim, {c} clients back to back" for c in CONCURRENCY},
              f"claim_c{CONCURRENCY[-1]}_shared": f"warm claim, {CONCURRENCY[-1]} clients back to back, client and "
                                                  "server sharing the CPUs as the scheduler places them",
              "claim_turnover": f"warm claim right after a delete, {turnover_clients(plan)} clients "
                                "at once (an RL step's turnover: deletions and refill under way)",
              f"http_floor_c{CONCURRENCY[-1]}": f"HTTP floor: a constant answer from a bare ASGI app on uvicorn, "
                                                f"{CONCURRENCY[-1]} clients back to back, loopback TCP",
              f"http_floor_unix_c{CONCURRENCY[-1]}": "HTTP floor as above, on a unix socket"}
    if what in phases:
        return phases[what], {"raw": RawClient.label, "sdk": SdkClient.label}[client]
    return name.replace("_", " "), ""


def notes(value: Figures) -> str:
    said = ["client, server loop: a CPU each"] if value.get("cpus_apart") else []
    if value.get("cold"):
        said.append(f"{value['cold']} cold" + (f" (p50 {value['cold_p50']:.1f} ms, not in p50/p99)"
                                               if value.get("cold_p50") else ""))
    if "claim_p50" in value:
        said.append(f"p50: claim {value['claim_p50']:.1f}, exec {value['exec_p50']:.1f}, "
                    f"delete {value['delete_p50']:.1f} ms")
    if "requested" in value:
        said.append(f"{value['n']}/{value['requested']} served in {value['wall_s']} s")
    if value.get("failed"):
        said.append(f"failed: {value['failed']}")
    return ", ".join(said)


def cell(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def table(figures: Figures, plan: Plan) -> Table:
    m = figures["machine"]
    report = Table(title=f"rollbox server benchmark ({figures['mode']}, {figures['elapsed_s']} s, "
                         f"server: {m['server']})",
                   caption=f"{m['cores']} cores, {m['memory_mb']} MB, Linux {m['kernel']}, runc {m['runc']}; "
                           f"load {m['load_before']} before, {m['load_after']} after. Latencies in ms; "
                           "CPU: ms per operation of the server process and of this one (the client); "
                           "load: 1-minute load average as the phase started")
    for column in ("measurement", "client"):
        report.add_column(column)
    for column in ("p50", "p99", "n", "/s", "server CPU", "client CPU", "load"):
        report.add_column(column, justify="right")
    report.add_column("target")
    report.add_column("notes")
    for name, value in figures.items():
        if name in ("machine", "mode", "elapsed_s", "plan", "missed"):
            continue
        what, client = describe(name, plan)
        phase = name.rpartition("_")[0]
        target = ""
        if phase in TARGETS:
            text = TARGETS[phase][0]
            target = f"[red]{text} MISSED[/]" if name in figures["missed"] else f"[green]{text} ok[/]"
        if isinstance(value, dict):
            report.add_row(what, client, cell(value["p50"]), cell(value["p99"]), str(value["n"]),
                           cell(value.get("per_s"), 1), cell(value.get("server_cpu_ms")),
                           cell(value.get("client_cpu_ms")), cell(value.get("load"), 1), target, notes(value))
        else:
            report.add_row(what, client, "", "", "", f"{value}" if name.endswith("per_s") else "", "", "", "",
                           target, "" if name.endswith("per_s") else f"{value} ms")
    return report


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"fewer samples and a burst of {QUICK.burst} claims (not {FULL.burst}): under a minute")
    parser.add_argument("--plot", type=Path, metavar="PNG",
                        help="also draw the claim phases' latency distributions, a panel per client, into PNG")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    start = time.perf_counter()
    figures = measure(plan)
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
