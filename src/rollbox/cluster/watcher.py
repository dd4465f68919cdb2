"""The router's picture of its cluster, kept current: which nodes serve, what they hold, and the warm pools'
shares brought back into line whenever nodes join, come back or leave.

It runs on the router's event loop, ticking a few times a second: it asks the cluster engine for its members
(`Members.poll`, in a thread: Ray's calls block), probes each node agent's health, copies templates and pools to
nodes that join or come back, spreads each pool's replicas over the serving nodes, and asks the cluster engine
for more nodes when the pools need more room than the nodes have. Requests read `view`, which is replaced whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import httpx
from anyio import to_thread

from rollbox._logs import throttled
from rollbox.cluster.placement import pool_shares
from rollbox.cluster.pools import ClusterPool, read_pools
from rollbox.cluster.remote import RemoteNode, no_progress
from rollbox.cluster.view import RESTART_WAIT, Member, NodeState
from rollbox.errors import NodeLost, NodeUnavailable
from rollbox.spec import API_VERSION, parse_resource

log = logging.getLogger("rollbox.cluster")
T = TypeVar("T")

SERVING = frozenset({"up", "joining"})
"""States in which a node answers for the sandboxes it has (a joining node takes no new claims yet)."""

TICK = 0.25
"""Seconds between two looks at the cluster."""
FAST_TICK = 0.05
"""Seconds between two looks while a node does not answer and calls wait for it."""
START_WAIT = 10.0
"""Seconds a starting router waits for the nodes it finds to be checked, before it serves anyway."""
PROBE_TIMEOUT = 1.0
"""Seconds a node agent has to answer its health probe before it counts as unreachable."""


class Members(Protocol):
    """A cluster engine's list of nodes (Ray's, or a fixed list of node agents)."""

    scales: bool
    """Whether the engine adds and removes nodes on request (then `want_nodes` and `release` do something)."""

    def poll(self, stale: set[str]) -> list[Member]:
        """The nodes now; `stale` names nodes whose agent stopped answering, whose address may have changed."""
    def want_nodes(self, count: int) -> None:
        """Asks for `count` nodes in all (0: no request)."""
    def release(self, name: str) -> None:
        """Stops the empty node's agent, so that the engine may take the node back; it is no member meanwhile."""
    def close(self) -> None: ...


class Watcher:
    def __init__(self, members: Members, remote: Callable[[str], RemoteNode], *, node_capacity: int,
                 release_idle: bool = False, tick: float = TICK) -> None:
        self.members = members
        self.remote = remote
        self.node_capacity = node_capacity
        """What a node the cluster engine adds would hold: max_sandboxes when it does not say."""
        self.tick = tick
        self.release_idle = release_idle
        """Whether nodes beyond what the pools and claims need are drained and their agents stopped, for an
        autoscaler to take back. Off, every node keeps serving, needed or not."""
        self.view: dict[str, NodeState] = {}
        self._synced: set[tuple[str, str | None]] = set()
        """(name, incarnation) of nodes whose templates and pools were brought in line since they came up."""
        self._syncing: dict[str, asyncio.Task[None]] = {}
        self._wanted = 0
        self.unnamed = 0
        """Node agents that never answered this router, so it cannot tell which sandboxes are theirs."""
        self.draining: set[str] = set()
        """Nodes beyond what the pools need, holding no claim: they take nothing new, and go once empty."""
        self._changed = asyncio.Event()
        self._wake = asyncio.Event()
        self._waiting = 0
        """Calls waiting for a node to serve again: while there are any, looks come FAST_TICK apart."""
        self._stopping: dict[str, set[asyncio.Future[None]]] = {}
        """Per node, what waits to learn that it stopped answering (`answering`)."""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Looks until the nodes found first serve (or a while), so that the first requests find them, then keeps
        looking in the background."""
        deadline = time.monotonic() + START_WAIT
        await self.look()
        while (any(node.status in ("unreachable", "joining") for node in self.view.values())
               and time.monotonic() < deadline):
            await asyncio.sleep(FAST_TICK)
            await self.look()
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        for task in [self._task, *self._syncing.values()]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await to_thread.run_sync(self.members.close)

    async def wait_serving(self, name: str, failed: float = 0.0) -> NodeState:
        """The node once a look after `failed` (monotonic time a call to it failed) finds it serving. NodeLost if it
        leaves meanwhile; NodeUnavailable once it has not answered for RESTART_WAIT (at once when it is down)."""
        self._waiting += 1
        self._wake.set()
        try:
            return await self._wait_serving(name, failed or time.monotonic())
        finally:
            self._waiting -= 1

    async def _wait_serving(self, name: str, failed: float) -> NodeState:
        while True:
            node = self.view.get(name)
            if node is not None and node.status == "lost":
                raise lost(node)
            if node is not None and node.status in SERVING and node.url is not None and node.seen > failed:
                return node
            silent = node.since if node is not None and node.status == "unreachable" else failed
            left = silent + RESTART_WAIT - time.monotonic()
            if left <= 0:
                raise down(name)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, self.tick))

    async def answering(self, name: str, call: Awaitable[T]) -> T:
        """`call`'s answer, unless a look finds node `name` not answering first: then the call is cancelled (its
        connection closed, so that the node drops a claim it makes for nobody) and NodeUnavailable raised. A frozen
        node holds up nothing else."""
        stopped = asyncio.get_running_loop().create_future()
        waiting = self._stopping.setdefault(name, set())
        waiting.add(stopped)
        task = asyncio.ensure_future(call)
        try:
            await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.discard(stopped)
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if not task.cancelled():
            return task.result()
        raise NodeUnavailable(f"node {name} stopped answering during the call; try again")

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FAST_TICK if self._waiting else self.tick)
            try:
                await self.look()
            except Exception:
                log.exception("looking at the cluster failed; trying again")

    async def look(self) -> None:
        stale = {name for name, node in self.view.items() if node.status == "unreachable"}
        members = await to_thread.run_sync(self.members.poll, stale)
        states = await asyncio.gather(*(self._probe(member) for member in members))
        self.unnamed = sum(state is None and member.alive for state, member in zip(states, members, strict=True))
        view: dict[str, NodeState] = {}
        for state in states:
            if state is None:
                continue
            held = view.get(state.name)
            if held is None or held.status == "lost":  # a node back under its old name outranks its past
                view[state.name] = state
        self.view = view
        self._changed.set()
        for name, waiting in self._stopping.items():
            node = view.get(name)
            if node is None or node.status not in SERVING:
                for stopped in waiting:
                    if not stopped.done():
                        stopped.set_result(None)
        self._sync_returning()
        await self._spread_pools()

    async def _probe(self, member: Member) -> NodeState | None:
        now = time.monotonic()
        before = self.view.get(member.name) if member.name else None
        if not member.alive:
            if member.name is None:
                return None
            since = before.since if before is not None and before.status == "lost" else now
            return NodeState(member.name, member.url, "lost", since, now, incarnation=member.incarnation)
        health = None
        if member.url is not None:
            with contextlib.suppress(Exception):
                health = await asyncio.wait_for(self.remote(member.url).health(), PROBE_TIMEOUT)
        name = member.name or (health or {}).get("node") or next(  # a URL's agent that stopped answering keeps its name
            (node.name for node in self.view.values() if node.url == member.url), None)
        if name is None:
            return None
        before = self.view.get(name)
        if health is None:
            since = before.since if before is not None and before.status == "unreachable" else now
            return NodeState(name, member.url, "unreachable", since, now, incarnation=member.incarnation)
        status = "up" if (name, member.incarnation) in self._synced else "joining"
        since = before.since if before is not None and before.status == status else now
        return NodeState(name, member.url, status, since, now, health.get("max_sandboxes") or 0,
                         health.get("sandboxes", 0), health.get("claims", 0), health.get("pools", {}),
                         member.incarnation)

    # -- nodes that join or come back ---------------------------------------------------------

    def _sync_returning(self) -> None:
        for name, node in self.view.items():
            key = (name, node.incarnation)
            if node.status != "joining" or name in self._syncing:
                continue
            self._syncing[name] = asyncio.create_task(self._sync(node, key))
        # a node that stopped answering, or left the list (released), is checked again when it is back
        self._synced = {(name, incarnation) for name, incarnation in self._synced
                        if name in self.view and self.view[name].status in SERVING}

    async def _sync(self, node: NodeState, key: tuple[str, str | None]) -> None:
        """Builds on `node` the templates the serving nodes have and it lacks (or has older)."""
        try:
            sources = [other for other in self.view.values() if other.status == "up" and other.url]
            if sources and node.url:
                target = self.remote(node.url)
                wanted = {t.name: t for t in await self.remote(sources[0].url).templates()}
                held = {t.name: t.spec for t in await target.templates()}
                for name, template in sorted(wanted.items()):
                    if held.get(name) != template.spec:
                        resource = parse_resource({"apiVersion": API_VERSION,
                                                   "kind": "SandboxTemplate", "metadata": {"name": name},
                                                   "spec": template.spec})
                        log.warning("node %s: building template %s", node.name, name)
                        await target.apply(resource, no_progress)
            self._synced.add(key)
        except (httpx.TransportError, NodeUnavailable) as error:  # it went again meanwhile
            throttled(log, logging.WARNING, "node %s: copying templates failed (%s); trying again", node.name, error)
        except Exception:
            log.exception("node %s: copying templates failed; trying again", node.name)
        finally:
            self._syncing.pop(node.name, None)

    # -- warm pools ------------------------------------------------------------------------

    def serving(self) -> list[NodeState]:
        """The nodes that take new claims and warm pool shares: answering, brought in line, not draining."""
        return [node for node in self.view.values()
                if node.status == "up" and node.url is not None and node.name not in self.draining]

    async def _spread_pools(self) -> None:
        pools = read_pools(self.view.values())
        self._autoscale(pools)
        await self.place(pools, self.serving())

    async def place(self, pools: dict[str, ClusterPool], serving: list[NodeState]) -> None:
        """Applies each pool's share to every serving node that does not keep it yet, and a share of none to the
        draining nodes that still keep one."""
        shares = pool_shares({name: pool.replicas for name, pool in pools.items()}, serving)
        draining = [node for node in self.view.values() if node.name in self.draining and node.status == "up"]
        for pool in shares.values():
            pool.update({node.name: 0 for node in draining})
        applies = [self.remote(node.url).apply(pool.share(shares[name][node.name]), no_progress)
                   for name, pool in pools.items() for node in [*serving, *draining]
                   if node.url is not None and not pool.kept_by(node, shares[name][node.name])]
        for failure in await asyncio.gather(*applies, return_exceptions=True):
            if isinstance(failure, Exception):
                throttled(log, logging.WARNING, "placing a warm pool's share failed: %s; trying again", failure)

    def _autoscale(self, pools: dict[str, ClusterPool]) -> None:
        """Holds a request for as many nodes as the pools' replicas need (none when they need none). With
        `release_idle`, drains the nodes beyond that which hold no claim: no new claims or pool shares go there,
        and once empty their agents stop, so that an autoscaler may take them back."""
        if not self.members.scales:
            return
        nodes = [node for node in self.view.values() if node.status in ("up", "joining")]
        demand = sum(pool.replicas for pool in pools.values())  # not the claims: they change by the second
        per_node = (sum(node.max_sandboxes for node in nodes) / len(nodes)) if nodes else self.node_capacity
        wanted = math.ceil(demand / max(per_node, 1))
        if wanted != self._wanted:
            self._wanted = wanted
            self.members.want_nodes(wanted)
        if not self.release_idle:
            return
        up = sorted((node for node in nodes if node.status == "up"), key=lambda node: (node.claims, node.name))
        surplus = len(up) - max(wanted, 1)
        self.draining = {node.name for node in up[len(up) - surplus:] if node.claims == 0} if surplus > 0 else set()
        for name in self.draining:
            if self.view[name].sandboxes == 0:
                log.warning("node %s is not needed and empty: stopping its agent", name)
                self.members.release(name)


def lost(node: NodeState) -> NodeLost:
    return NodeLost(f"node {node.name} left the cluster, and its sandboxes with it: claim a new sandbox")


def down(name: str) -> NodeUnavailable:
    return NodeUnavailable(f"node {name} is down: its agent has not answered for {RESTART_WAIT:g} s or more; calls on "
                           "its sandboxes answer at once until it is back", retry=False)
