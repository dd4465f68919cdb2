"""Room on the node and tenants' quotas: how many containers may run, and how many sandboxes each tenant holds.

`max_sandboxes` counts every container on the node (claimed, warm, starting, being deleted): a deleted
sandbox's container holds its room until it is gone. A full node fails a claim at once, unless deletions
under way will free room soon: then the claim waits for them, at most ROOM_WAIT seconds.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from rollbox.errors import CapacityExceeded, InvalidResource

ROOM_WAIT = 10.0


class Capacity:
    """Counts containers and tenants' sandboxes; thread-safe. `on_room` is called whenever room is freed."""

    def __init__(self, max_sandboxes: int, tenant_quota: int | None, on_room: Callable[[], None]) -> None:
        self.max_sandboxes = max_sandboxes
        self.tenant_quota = tenant_quota
        self.count = 0
        """Containers on the node: claimed, warm, starting and being deleted."""
        self.deleting = 0
        self.wanting_room = 0
        """Callers waiting for deletions to free room: deletions then start at once."""
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._tenants: Counter[str] = Counter()
        self._on_room = on_room

    def adopt(self, containers: int, tenants: Counter[str]) -> None:
        """Starts from what a restarted node found: its containers, and the sandboxes each tenant holds."""
        with self._lock:
            self.count = containers
            self._tenants = tenants

    # -- containers ---------------------------------------------------------------------------

    def reserve(self, count: int, wait: bool = True) -> None:
        """Takes room for `count` containers. A full node fails at once, unless deletions under way
        will free room: then it waits for them, at most ROOM_WAIT seconds."""
        deadline = time.monotonic() + ROOM_WAIT
        with self._room:
            while self.count + count > self.max_sandboxes:
                left = deadline - time.monotonic()
                if not wait or not self.deleting or left <= 0:
                    raise CapacityExceeded(f"this node is at its maximum of {self.max_sandboxes} sandboxes: "
                                           "delete sandboxes or warm pools, or retry later")
                self.wanting_room += 1
                try:
                    self._room.wait(left)
                finally:
                    self.wanting_room -= 1
            self.count += count

    def release(self, count: int, deleted: bool = False) -> None:
        """Gives back room for `count` containers, once gone (`deleted`: by a deletion counted in `deleting`)."""
        with self._room:
            self.count -= count
            self.deleting -= int(deleted)
            self._room.notify_all()
        self._on_room()

    def deleting_one(self) -> None:
        """A deletion starts: callers short of room may wait for it."""
        with self._lock:
            self.deleting += 1

    def fit_pool(self, name: str, replicas: int, others: Mapping[str, int]) -> None:
        """Refuses a warm pool whose `replicas` could never all be ready: more than the node runs, or than the
        room the other pools' replicas leave. Filling what it can instead would leave it short for good."""
        kept = sum(others.values())
        room = self.max_sandboxes - kept
        if replicas <= room:
            return
        where = f"warm pool {name}: replicas {replicas} cannot fit this node, which runs at most {self.max_sandboxes}"
        server = "or give the node a larger max_sandboxes (rollbox serve --max-sandboxes)"
        if not kept:
            raise InvalidResource(f"{where} sandboxes: lower replicas to {self.max_sandboxes} or fewer, {server}")
        pools = ", ".join(f"{other} ({count})" for other, count in sorted(others.items()) if count)
        raise InvalidResource(f"{where} sandboxes while warm pools {pools} keep {kept} ready: lower replicas to "
                              f"{max(room, 0)} or fewer, lower the other pools' replicas, {server}")

    # -- tenants ------------------------------------------------------------------------------

    def take_quota(self, tenant: str, count: int) -> None:
        with self._lock:
            held = self._tenants[tenant]
            if self.tenant_quota is not None and held + count > self.tenant_quota:
                raise CapacityExceeded(f"tenant {tenant!r} holds {held} sandboxes and its quota is "
                                       f"{self.tenant_quota}: delete some first")
            self._tenants[tenant] += count

    def give_quota(self, tenant: str, count: int) -> None:
        with self._lock:
            self._tenants[tenant] -= count
