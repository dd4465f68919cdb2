"""Where claims and warm pool replicas go across a cluster's nodes: pure functions of what the router sees."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from rollbox.cluster.view import NodeState


def split(total: int, rooms: Mapping[str, int]) -> dict[str, int]:
    """`total` replicas over nodes in proportion to each one's room, none above its room (largest remainders,
    ties to the name first in order, so every router splits alike). The sum falls short of `total` only when
    the rooms do."""
    rooms = {name: max(room, 0) for name, room in sorted(rooms.items())}
    free = sum(rooms.values())
    if total >= free:
        return dict(rooms)
    shares = {name: total * room // free for name, room in rooms.items()}
    left = total - sum(shares.values())
    remainders = sorted(rooms, key=lambda name: (-(total * rooms[name] % free), name))
    for name in remainders[:left]:
        shares[name] += 1
    return shares


def pool_shares(pools: Mapping[str, int], nodes: Iterable[NodeState]) -> dict[str, dict[str, int]]:
    """Each pool's replicas per node (pool name to node name to replicas): each pool's total (`fair_totals`),
    spread in name order by the room the pools before it left (a node's max_sandboxes less their shares). Claims
    do not count: the split stays put while they come and go, and a node's pools refill as its claims end."""
    rooms = {node.name: node.max_sandboxes for node in nodes}
    totals = fair_totals(pools, sum(max(room, 0) for room in rooms.values()))
    shares: dict[str, dict[str, int]] = {}
    for pool, total in sorted(totals.items()):
        shares[pool] = split(total, rooms)
        for name, share in shares[pool].items():
            rooms[name] -= share
    return shares


def fair_totals(pools: Mapping[str, int], room: int) -> dict[str, int]:
    """Each pool's replicas, all of them when `room` holds every pool's; otherwise shared max-min fairly: the
    smaller pools get all they ask, the larger ones equal parts of what is left, so that no pool goes without
    because a larger one came first."""
    totals = {}
    asks = sorted(((max(replicas, 0), name) for name, replicas in pools.items()))
    for i, (replicas, name) in enumerate(asks):
        totals[name] = min(replicas, max(room, 0) // (len(asks) - i))
        room -= totals[name]
    return totals


def claim_order(nodes: Iterable[NodeState], warmpool: str | None, ready: Mapping[tuple[str, str], int]) -> list[str]:
    """The nodes to try for a claim, best first: those with a ready warm sandbox of `warmpool` (most ready first,
    as `ready` estimates them between health reports), then the least loaded."""
    return [node.name for node in sorted(nodes, key=_rank(warmpool, ready))]


def first_choice(nodes: Iterable[NodeState], warmpool: str | None,
                 ready: Mapping[tuple[str, str], int]) -> str | None:
    """`claim_order`'s first node, in one pass: a claim needs the rest only when that node refuses."""
    best = min(nodes, key=_rank(warmpool, ready), default=None)
    return None if best is None else best.name


def _rank(warmpool: str | None, ready: Mapping[tuple[str, str], int]) -> Callable[[NodeState], tuple[int, float, str]]:
    def rank(node: NodeState) -> tuple[int, float, str]:
        warm = ready.get((node.name, warmpool), 0) if warmpool else 0
        load = node.sandboxes / node.max_sandboxes if node.max_sandboxes else 1.0
        return (-warm if warm > 0 else 0, load, node.name)

    return rank


class ReadyEstimate:
    """Ready warm sandboxes per (node, pool), as the nodes last reported them, less the claims sent there since: what
    a router ranks claims by between two health reports."""

    def __init__(self) -> None:
        self.ready: dict[tuple[str, str], int] = {}
        self._reported: Mapping[str, NodeState] | None = None

    def refresh(self, view: Mapping[str, NodeState]) -> None:
        """Starts again from the nodes' reports when the router has looked at them since."""
        if view is self._reported:
            return
        self._reported = view
        self.ready = {(node.name, pool): held.get("ready", 0) for node in view.values() if node.status == "up"
                      for pool, held in node.pools.items()}

    def candidates(self, nodes: Iterable[NodeState], warmpool: str | None) -> Iterator[str]:
        """The nodes a claim tries, best first; the others are ranked only if the best refuses."""
        nodes = list(nodes)
        first = first_choice(nodes, warmpool, self.ready)
        if first is None:
            return
        yield first
        yield from (name for name in claim_order(nodes, warmpool, self.ready) if name != first)

    def took(self, node: str, warmpool: str | None) -> None:
        """A claim of `warmpool` was sent to `node`: one ready sandbox fewer there, until its next report."""
        if warmpool:
            self.ready[(node, warmpool)] = self.ready.get((node, warmpool), 0) - 1
