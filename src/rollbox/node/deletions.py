"""Deleting containers in the background, out of the claims' way.

An RL trainer deletes a step's sandboxes and claims the next step's at once, and deleting a container
costs CPU (runtime, unmounts, cgroups) that the claims then wait for. So deletions run in threads of
their own at a lower CPU priority (DELETE_NICE), and wait for claims to pause (DELETE_QUIET) before they
start, at most DELETE_HOLD_MAX, and not at all while a caller waits for the room one frees.
docs/design-notes.md gives the figures.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from rollbox.engine import Engine
from rollbox.errors import SandboxNotFound
from rollbox.node.capacity import Capacity
from rollbox.node.pools import REFILL_QUIET
from rollbox.node.store import NodeStore

log = logging.getLogger("rollbox.node")

DELETE_QUIET = REFILL_QUIET
"""Seconds without a claim before a background deletion starts, as before a pool's refill."""
DELETE_HOLD_MAX = 1.0
"""Seconds a deletion waits for claims to pause at most, so that a steady stream of claims still frees room."""
DELETE_NICE = 10
"""Scheduling priority of the deletion threads (and of the runtime calls they make): below the event loop's."""


class Deletions:
    """Deletes the containers no claim or pool holds any more; `close` waits for those under way."""

    def __init__(self, engine: Engine, store: NodeStore, capacity: Capacity, closed: threading.Event) -> None:
        self.engine = engine
        self.store = store
        self.capacity = capacity
        self.last_claim = 0.0
        """Monotonic time of the last claim, which holds deletions back (DELETE_QUIET)."""
        self._closed = closed
        self._workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rollbox-delete",
                                           initializer=_lower_priority, initargs=(DELETE_NICE,))

    def discard(self, container_ids: Iterable[str]) -> None:
        """Deletes containers a pool started and no longer wants (nor any claim holds)."""
        container_ids = list(container_ids)
        if container_ids:
            self.store.remove_pool_containers(container_ids)
        for container_id in container_ids:
            self.later(container_id)

    def later(self, container_id: str) -> None:
        """Deletes a container once claims pause, then gives its room back."""
        def delete() -> None:
            try:
                self._hold_for_claims()
                self.now(container_id)
            finally:
                self.capacity.release(1, deleted=True)

        self.capacity.deleting_one()
        try:
            self._workers.submit(delete)
        except RuntimeError:  # closing: delete it here
            delete()

    def evict(self, container_id: str) -> None:
        """Deletes a warm container whose room the caller took over: no room is given back."""
        self.store.remove_pool_containers([container_id])
        self._workers.submit(self.now, container_id)

    def now(self, container_id: str) -> None:
        try:
            self.engine.delete(container_id)
        except SandboxNotFound:
            pass
        except Exception:
            log.exception("deleting container %s failed", container_id)

    def close(self) -> None:
        self._workers.shutdown(wait=True)

    def _hold_for_claims(self) -> None:
        """Waits until no claim came for DELETE_QUIET seconds, at most DELETE_HOLD_MAX, unless a caller waits for
        the room a deletion frees or the node closes."""
        deadline = time.monotonic() + DELETE_HOLD_MAX
        while not self.capacity.wanting_room:
            wait = min(self.last_claim + DELETE_QUIET, deadline) - time.monotonic()
            if wait <= 0 or self._closed.wait(min(wait, DELETE_QUIET)):
                return


def _lower_priority(nice: int) -> None:
    """Lowers the calling thread's CPU priority (Linux schedules threads one by one); its children inherit it."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
