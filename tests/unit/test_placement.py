"""Where a cluster's router puts warm pool replicas and claims (rollbox.cluster.placement): pure functions."""

from __future__ import annotations

import random

import pytest

from rollbox.cluster.placement import claim_order, fair_totals, pool_shares, split
from rollbox.cluster.view import NodeState


def node(name: str, max_sandboxes: int, sandboxes: int = 0, claims: int = 0) -> NodeState:
    return NodeState(name, f"http://{name}:8090", "up", 0.0, max_sandboxes=max_sandboxes, sandboxes=sandboxes,
                     claims=claims)


@pytest.mark.parametrize(("total", "rooms", "shares"), [
    (6, {"alpha": 16, "beta": 8}, {"alpha": 4, "beta": 2}),  # exactly proportional
    (8, {"alpha": 16, "beta": 8}, {"alpha": 5, "beta": 3}),  # remainders 8/24 and 16/24: beta's is larger
    (7, {"a": 10, "b": 10, "c": 10}, {"a": 3, "b": 2, "c": 2}),  # equal remainders: the first name
    (2, {"c": 1, "b": 1, "a": 1}, {"a": 1, "b": 1, "c": 0}),  # whatever order the rooms come in
    (0, {"a": 4, "b": 4}, {"a": 0, "b": 0}),
    (5, {}, {}),
])
def test_split_is_proportional_with_the_largest_remainders(total: int, rooms: dict[str, int],
                                                           shares: dict[str, int]) -> None:
    assert split(total, rooms) == shares


@pytest.mark.parametrize(("total", "rooms", "shares"), [
    (100, {"alpha": 3, "beta": 5}, {"alpha": 3, "beta": 5}),
    (8, {"alpha": 3, "beta": 5}, {"alpha": 3, "beta": 5}),
    (4, {"alpha": -2, "beta": 3}, {"alpha": 0, "beta": 3}),  # a node over its room (claims) takes none
    (3, {"alpha": 0}, {"alpha": 0}),
])
def test_split_never_goes_past_a_nodes_room(total: int, rooms: dict[str, int], shares: dict[str, int]) -> None:
    assert split(total, rooms) == shares


def test_split_sums_to_the_total_when_the_rooms_suffice_and_every_router_splits_alike() -> None:
    generator = random.Random(20)
    for _ in range(2000):
        rooms = {f"node-{index}": generator.randint(-3, 40) for index in range(generator.randint(1, 9))}
        total = generator.randint(0, 200)
        shares = split(total, rooms)
        free = sum(max(room, 0) for room in rooms.values())
        assert set(shares) == set(rooms)
        assert sum(shares.values()) == min(total, free), (total, rooms, shares)
        for name, share in shares.items():
            assert 0 <= share <= max(rooms[name], 0)
            if total < free:
                assert abs(share - total * max(rooms[name], 0) / free) < 1, (total, rooms, shares)
        shuffled = list(rooms.items())
        generator.shuffle(shuffled)
        assert split(total, dict(shuffled)) == shares


def test_pool_shares_give_each_pool_in_name_order_the_room_the_ones_before_left() -> None:
    nodes = [node("alpha", 16), node("beta", 8)]
    assert pool_shares({"zz-overflow": 100, "rl-python": 8}, nodes) == {
        "rl-python": {"alpha": 5, "beta": 3}, "zz-overflow": {"alpha": 11, "beta": 5}}
    assert pool_shares({"b": 4, "c": 4}, nodes) == {"b": {"alpha": 3, "beta": 1}, "c": {"alpha": 3, "beta": 1}}
    assert pool_shares({}, nodes) == {}
    assert pool_shares({"rl-python": 8}, []) == {"rl-python": {}}


def test_pools_short_of_room_share_it_fairly_whatever_their_names() -> None:
    nodes = [node("alpha", 16), node("beta", 8)]
    # the first pool by name could take the whole room: the smaller one still gets all it asks
    assert pool_shares({"a": 24, "b": 4}, nodes) == {"a": {"alpha": 13, "beta": 7}, "b": {"alpha": 3, "beta": 1}}
    assert fair_totals({"a": 100, "b": 100, "c": 2}, 24) == {"c": 2, "a": 11, "b": 11}
    assert fair_totals({"a": 100, "b": 100, "c": 100}, 10) == {"a": 3, "b": 3, "c": 4}
    assert fair_totals({"a": 5, "b": 7}, 24) == {"a": 5, "b": 7}
    assert fair_totals({"a": 5, "b": -1}, 0) == {"a": 0, "b": 0}


def test_pool_shares_ignore_claims_so_the_split_stays_put_while_they_come_and_go() -> None:
    idle = [node("alpha", 16), node("beta", 8)]
    busy = [node("alpha", 16, sandboxes=16, claims=11), node("beta", 8, sandboxes=3, claims=0)]
    assert pool_shares({"p": 8, "q": 3}, busy) == pool_shares({"p": 8, "q": 3}, idle)


def test_claims_go_first_where_warm_sandboxes_are_ready_most_first() -> None:
    nodes = [node("alpha", 16, sandboxes=2), node("beta", 8, sandboxes=7), node("gamma", 8, sandboxes=1)]
    assert claim_order(nodes, "pool", {("beta", "pool"): 1, ("alpha", "pool"): 3}) == ["alpha", "beta", "gamma"]
    assert claim_order(nodes, "pool", {("beta", "pool"): 4, ("alpha", "pool"): 3}) == ["beta", "alpha", "gamma"]
    # none ready of that pool (or estimated below zero after claims sent there): the least loaded first
    assert claim_order(nodes, "pool", {("beta", "other"): 5, ("alpha", "pool"): -1}) == ["alpha", "gamma", "beta"]


def test_claims_without_a_pool_go_to_the_least_loaded_node() -> None:
    nodes = [node("alpha", 16, sandboxes=8), node("beta", 8, sandboxes=2), node("gamma", 0),
             node("delta", 8, sandboxes=2)]
    assert claim_order(nodes, None, {("alpha", "pool"): 5}) == ["beta", "delta", "alpha", "gamma"]
    assert claim_order([], "pool", {}) == []
