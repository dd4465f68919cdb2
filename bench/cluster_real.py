"""The real-cluster phases of bench/cluster.py: node agents (`rollbox node`, each with a data directory and an engine
of its own) behind one router, and with Ray a router over node agents on a local Ray cluster, against the
single-machine `rollbox serve` in the same run, all reached alike (loopback TCP, a tenant token) and all holding the
same warm pool: warm claims at 1 and 64 clients, and `true` run one at a time. They take turns round by round, so
that all meet the same moments of a shared machine. The single server is also reached through bench/tcp_splice.py,
a proxy that only copies bytes: the cost of one more process on the way, which no router can go below. And `true`
runs through bench/http_forwarder.py in front of one of the router's node agents: a hop in Python (uvicorn and the
router's connection pool) that does nothing else, so what the router adds beyond it is the router's own work.

The 64-client rounds run with the client on one CPU and the event loop of the process it talks to (the single
server, or the router) on the other, as bench/server.py times claims (see cpu.cpus_apart), and in a full run once
more as the scheduler places everything. The node agents run where the scheduler puts them even in the first: two
cores cannot give the client, the router and the nodes one each, as machines of their own would.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
from rich.progress import Progress

from claims import claim_round
from clients import Client, RawClient, SdkClient, succeed, timed
from cluster_processes import (
    TOKEN,
    TOKEN_ARGS,
    Child,
    edge_worker,
    forwarding,
    rollbox,
    router,
    secret_file,
    server_args,
    spliced,
)
from common import Figures, teardown
from cpu import Tally, cpu_seconds
from plan import Plan
from pool import NAME, Control, resources
from rollbox.client import SandboxClient
from rollbox.engine import Engine
from rollbox.errors import RollboxError

NODES = ("bench-a", "bench-b", "bench-c")
REPO = Path(__file__).resolve().parents[1]
"""Where tests/support/ray_cluster.py is found: the Ray cluster is the cluster tests' own."""
TRUE = ["true"]
T = TypeVar("T")
ORDER_SEED = 20
"""Seeds the order in which the sides take their turns, shuffled every round: one that always followed the same
side would find the caches it shares with it (a node agent, the single server) warm or cold every time, which moved
its p50 by more than the targets' margins (docs/cluster.md). The same seed gives every run the same orders."""


@dataclass(frozen=True)
class RealPlan:
    pool: int
    """Warm sandboxes of each side: the single server's pool, and the router's split over its nodes."""
    claims: int
    """Warm claims of 64 clients per side (and pass)."""
    one_by_one: int
    """Warm claims of a single client per side: the hop alone, with no queue."""
    execs: int
    clients: tuple[type[Client], ...]
    shared: bool
    """Whether the 64-client rounds run a second time with the CPUs shared as the scheduler places everything."""

    @property
    def room(self) -> int:
        """Sandboxes the single server holds at most: its pool, a round's claims, and a pool's worth of refills."""
        return 2 * self.pool + 64

    @property
    def node_room(self) -> int:
        """Sandboxes a node of a cluster holds at most: less than half the pool, so that a router over Ray, which
        drains the nodes its pools do not need, wants all three (a node's share of the pool and of a round's claims
        fit in it; claiming a warm sandbox takes no room)."""
        return self.pool // 2 - 1

    @property
    def rounds(self) -> Plan:
        """The claim rounds' sizes, as bench/server.py's claim phases read them (claim_round, Plan.round)."""
        return Plan(pool=self.pool, claims=self.claims, execs=self.execs, exec_load=0, python=0, burst=0, creates=0,
                    workers=0)


QUICK = RealPlan(pool=96, claims=64, one_by_one=64, execs=200, clients=(RawClient,), shared=False)
FULL = RealPlan(pool=192, claims=384, one_by_one=128, execs=1000, clients=(RawClient, SdkClient), shared=True)


@dataclass
class Side:
    """One way to a warm pool: the single server, or a router in front of node agents (whose pids `nodes` holds)."""

    name: str
    front: Child
    nodes: tuple[int, ...] = ()
    owns_pool: bool = True
    """False for a side that reaches another side's server, and so its pool."""
    claims: bool = True
    """False for a side that only runs commands (one that reaches a single node agent holding a share of a pool)."""
    control: Control = field(init=False)

    def __post_init__(self) -> None:
        self.control = Control(self.front.url, TOKEN)

    @property
    def pid(self) -> int:
        """The process the client talks to: nginx's worker at a router's edge, else the front's own."""
        return edge_worker(self.front.pid) or self.front.pid

    @property
    def behind(self) -> tuple[int, ...]:
        """The processes behind it: a router's own process behind nginx, and the node agents."""
        return self.nodes if self.pid == self.front.pid else (self.front.pid, *self.nodes)


@dataclass
class SideTally(Tally):
    """A Tally that also counts the node agents' CPU time (a router's nodes), per operation."""

    nodes: tuple[int, ...] = ()
    nodes_cpu: float = 0.0

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        spent = sum(map(cpu_seconds, self.nodes))
        with super().timing():
            yield
        self.nodes_cpu += sum(map(cpu_seconds, self.nodes)) - spent

    def figures(self) -> Figures:
        figures = super().figures()
        if self.nodes:
            count = max(len(self.latencies) + len(self.cold), 1)
            figures["nodes_cpu_ms"] = round(self.nodes_cpu * 1000 / count, 3)
        return figures


def measure(root: Path, plan: RealPlan, progress: Progress, ray: bool) -> Figures:
    secret = secret_file(root)
    data = {name: root / name for name in ("single", *NODES)}
    most = plan.node_room
    try:
        with contextlib.ExitStack() as running:
            single = running.enter_context(rollbox(root, "single", *server_args(
                "--data-dir", str(data["single"]), "--max-sandboxes", str(plan.room), "--delete-on-exit")))
            agents = [running.enter_context(rollbox(root, name, "node", "--name", name, "--data-dir", str(data[name]),
                                                    "--secret-file", str(secret), "--max-sandboxes", str(most)))
                      for name in NODES]
            urls = [agent.url for agent in agents]
            front = running.enter_context(router(root, "router", urls, secret, "nginx"))
            by_python = running.enter_context(router(root, "pyrouter", urls, secret, "python"))
            splice = running.enter_context(spliced(root, "spliced", single))
            forwarder = running.enter_context(forwarding(root, "forwarded", agents[0], secret))
            sides = [Side("single", single), Side("spliced", splice, owns_pool=False),
                     Side("router", front, tuple(agent.pid for agent in agents)),
                     Side("pyrouter", by_python, tuple(agent.pid for agent in agents), owns_pool=False),
                     Side("forwarded", forwarder, (agents[0].pid,), owns_pool=False, claims=False)]
            failed = {}
            if ray:
                try:
                    sides.append(running.enter_context(on_ray(root / "ray", most, plan.pool)))
                except Exception as error:  # the other sides are still worth measuring: the verdicts say it failed
                    failed["ray_failed"] = f"{type(error).__name__}: {error}"[:2000]
            planes = {f"{side.name}_data_plane": httpx.get(f"{side.front.url}/healthz").json()["data_plane"]
                      for side in sides if side.name in ("router", "pyrouter", "ray")}
            return {**asyncio.run(compare(sides, plan, progress)), **failed, **planes}
    finally:
        for path in data.values():
            if (path / "state.db").exists():
                teardown(Engine(path))


@contextlib.contextmanager
def on_ray(root: Path, most: int, pool: int) -> Iterator[Side]:
    """A router (`rollbox serve --ray ADDRESS`) over a local Ray cluster: a head and a worker raylet per node, each
    worker a rollbox node (its agent a Ray actor) with a data directory of its own, as the cluster tests make it.
    The benchmark's pool is applied as soon as a node serves: until then the router needs no node and stops all
    agents but one's."""
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    from tests.support.ray_cluster import RayTestCluster

    root.mkdir()
    cluster = RayTestCluster(root, workers=len(NODES), max_sandboxes=most)
    try:
        cluster.start_router(0, *TOKEN_ARGS)
        cluster.wait_for(lambda health: any(node["status"] == "up" for node in health["nodes"].values()),
                         what="a serving node")
        apply_while_draining(cluster.url, resources(pool))
        cluster.wait_serving(len(NODES))
        assert cluster.router is not None
        front = Child("ray", cluster.url, cluster.router.pid, root / "router.log")
        yield Side("ray", front, tuple(cluster.agent_pid(name) for name in cluster.nodes))
    finally:
        left = cluster.close()
    if left:
        raise RuntimeError(f"the Ray cluster's nodes left {left} on this machine")


def apply_while_draining(url: str, resources: str, attempts: int = 10) -> None:
    """Applies `resources` through a router that may be stopping the agents it does not need: a node it stopped
    still stands in its view until its next look, and an apply that reaches it fails (tried again a second later)."""
    with SandboxClient(url, TOKEN) as client:
        for attempt in range(attempts):
            try:
                client.apply(resources)
                return
            except RollboxError as error:
                if error.status < 500 or attempt == attempts - 1:
                    raise
                time.sleep(1.0)


async def compare(sides: list[Side], plan: RealPlan, progress: Progress) -> Figures:
    figures: Figures = {}
    try:
        await asyncio.gather(*(side.control.apply(plan.pool) for side in sides if side.owns_pool))
        for kind in plan.clients:
            clients = [kind(side.front.url, TOKEN) for side in sides]
            try:
                claiming = [index for index, side in enumerate(sides) if side.claims]
                for concurrency, apart in ((1, True), (64, True), *([(64, False)] if plan.shared else [])):
                    figures.update(await warm_claims([sides[index] for index in claiming],
                                                     [clients[index] for index in claiming], concurrency, apart, plan,
                                                     progress))
                figures.update(await true_in_turns(sides, clients, plan, progress))
            finally:
                for client in clients:
                    await client.close()
    finally:
        for side in sides:
            await side.control.close(delete=side.owns_pool)
    baseline = sides[0].name
    for side in sides[1:]:
        for client in (kind.name for kind in plan.clients):
            for phase in ("claim_c64", "exec_true") if side.claims else ("exec_true",):
                figures[f"{side.name}_added_{phase}_{client}_ms"] = round(
                    figures[f"{side.name}_{phase}_{client}"]["p50"] - figures[f"{baseline}_{phase}_{client}"]["p50"], 3)
    return figures


async def warm_claims(sides: list[Side], clients: list[Client], concurrency: int, apart: bool, plan: RealPlan,
                      progress: Progress) -> Figures:
    """Warm claims by `concurrency` clients back to back, each side in turn, round after round. Rounds are no
    bigger than bench/server.py's, so no pool refills while one is timed, and every side settles before each: a
    round's deletes and refills are over before the next side's round starts."""
    rounds = plan.rounds
    order = random.Random(ORDER_SEED)
    tallies = [SideTally(side.pid, apart, nodes=side.behind) for side in sides]
    left = max(plan.claims if concurrency > 1 else plan.one_by_one, concurrency) // concurrency * concurrency
    shared = "" if apart else ", CPUs shared"
    tasks = [progress.add_task(f"{side.name}: claim x {concurrency} concurrent{shared}, {client.label}", total=left)
             for side, client in zip(sides, clients, strict=True)]
    while left > 0:
        size = min(left, max(concurrency, rounds.round // concurrency * concurrency))
        for client, tally, task in shuffled(zip(clients, tallies, tasks, strict=True), order):
            await settle(sides)
            await claim_round(client, tally, concurrency, size, progress, task)
        left -= size
    suffix = "" if apart else "_shared"
    return {f"{side.name}_claim_c{concurrency}{suffix}_{client.name}": tally.figures()
            for side, client, tally in zip(sides, clients, tallies, strict=True)}


async def settle(sides: list[Side]) -> None:
    await asyncio.gather(*(side.control.settle() for side in sides))


async def true_in_turns(sides: list[Side], clients: list[Client], plan: RealPlan, progress: Progress) -> Figures:
    """`true` in a claimed sandbox, one at a time, each side in turn (unpinned, as bench/server.py's round trips)."""
    order = random.Random(ORDER_SEED)
    await settle(sides)
    handles = [await client.claim(NAME) for client in clients]
    tallies = [SideTally(side.pid, nodes=side.behind) for side in sides]
    names = ", ".join(side.name for side in sides)
    task = progress.add_task(f"exec true, {names} in turns, {clients[0].label}", total=plan.execs)
    try:
        for client, handle in zip(clients, handles, strict=True):
            await succeed(client, handle, TRUE)
        for _ in range(plan.execs):
            for client, handle, tally in shuffled(zip(clients, handles, tallies, strict=True), order):
                with tally.timing():
                    latency, _ = await timed(succeed(client, handle, TRUE))
                tally.latencies.append(latency)
            progress.advance(task)
    finally:
        await asyncio.gather(*(client.delete(handle) for client, handle in zip(clients, handles, strict=True)))
    return {f"{side.name}_exec_true_{client.name}": tally.figures()
            for side, client, tally in zip(sides, clients, tallies, strict=True)}


def shuffled(turns: Iterable[T], order: random.Random) -> list[T]:
    """This round's turns, in an order of their own (see ORDER_SEED)."""
    turns = list(turns)
    order.shuffle(turns)
    return turns
