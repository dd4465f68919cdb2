"""Warm pools: ready sandboxes of one template, waiting for claims.

A claim only pops an id off the pool; starting sandboxes happens in the background, at most
`refillConcurrency` at a time per pool, so a burst of claims never waits on a container start
unless the pool runs dry. Refilling waits for a burst to pass (REFILL_QUIET without a claim)
unless the pool runs low, because starting containers competes with the burst for the CPU.
A claim wakes the refill thread only when that thread would otherwise sleep past the moment it
must act: waking a thread per claim costs the event loop more than the claim itself.

A pool with `maxReplicas` follows its demand: it keeps as many ready sandboxes as the largest
burst of claims it served in the last BURST_MEMORY seconds (an RL trainer claims a step's
episodes at once), between `replicas` and `maxReplicas`, and shrinks back once no such burst came.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from rollbox.errors import CapacityExceeded
from rollbox.spec import SandboxWarmPool

log = logging.getLogger("rollbox.node")

Launch = Callable[["WarmPool"], str]
"""Starts one ready container for the pool and records it as the pool's; raises CapacityExceeded when full."""
Discard = Callable[[str], None]
"""Deletes a container the pool no longer wants (started for a template that has since changed)."""
Watch = Callable[[str], None]
"""Told of every container the pool starts, once ready, so that one dying while it waits leaves the pool (`forget`)."""
_CAPACITY_RETRY = 0.5
REFILL_QUIET = 0.1
BURST_GAP = 1.0
"""Claims less than this many seconds apart belong to one burst."""
BURST_MEMORY = 300.0
"""Seconds a pool with `maxReplicas` stays sized for a burst it served."""
_MAX_BACKOFF = 10.0


class WarmPool:
    """Keeps `replicas` sandboxes of one template started and answering."""

    def __init__(self, resource: SandboxWarmPool, launch: Launch, discard: Discard, watch: Watch,
                 submit: Callable[[Callable[[], None]], object], ready: list[str] | None = None) -> None:
        self.resource = resource
        self.template = resource.spec.sandbox_template_ref.name
        """The template its sandboxes start from (read on every claim, so kept at hand)."""
        self.ready: deque[str] = deque(ready or ())
        self.starting = 0
        self._launch = launch
        self._discard = discard
        self._watch = watch
        self._submit = submit
        self._cond = threading.Condition()
        self._generation = 0
        self._retry_at = 0.0
        self._last_take = 0.0
        self._backoff = 0.0
        self._closed = False
        self._wakes_at = 0.0
        """When the refill thread looks at the pool again by itself (inf: only when notified; 0: awake)."""
        self._burst = 0
        """Claims in the burst under way (see BURST_GAP)."""
        self._bursts: deque[tuple[float, int]] = deque()
        """(when it ended, claims) of the last BURST_MEMORY seconds' bursts that can still set the target:
        each larger than every later one, so the first is the largest (read on every claim)."""
        self._thread = threading.Thread(target=self._refill, name=f"rollbox-pool-{self.name}", daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return self.resource.metadata.name

    @property
    def target(self) -> int:
        """Ready sandboxes the pool keeps: `replicas`, or up to `maxReplicas` to serve its recent bursts again."""
        spec = self.resource.spec
        if spec.max_replicas is None:
            return spec.replicas
        peak = max(self._burst, self._bursts[0][1] if self._bursts else 0)
        return min(spec.max_replicas, max(spec.replicas, peak))

    def take(self) -> str | None:
        """A ready container's id, or None when the pool is empty right now."""
        with self._cond:
            if not self.ready:
                return None
            container_id = self.ready.popleft()
            self._count_claim()
            return container_id

    def missed(self) -> None:
        """A claim for this pool found it empty (and starts cold): it still counts in the pool's burst."""
        with self._cond:
            self._count_claim()

    def _count_claim(self) -> None:
        """Counts a claim in the burst under way and wakes the refill if it must act (call holding the lock)."""
        now = time.monotonic()
        self._end_burst(now)
        self._burst += 1
        self._last_take = now
        self._nudge(now)

    def forget(self, container_id: str) -> bool:
        """Drops a ready container that no longer exists; False if a claim took it meanwhile."""
        with self._cond:
            if container_id not in self.ready:
                return False
            self.ready.remove(container_id)
            self._nudge(time.monotonic())
            return True

    def update(self, resource: SandboxWarmPool) -> list[str]:
        """Applies a new spec; returns the ready sandboxes it no longer wants (to delete)."""
        with self._cond:
            changed_template = resource.spec.sandbox_template_ref != self.resource.spec.sandbox_template_ref
            self.resource = resource
            self.template = resource.spec.sandbox_template_ref.name
            surplus = self.drain() if changed_template else self._trim()
            self._cond.notify()
            return surplus

    def drain(self) -> list[str]:
        """Empties the pool, also of sandboxes still starting: they are discarded when they come up."""
        with self._cond:
            self._generation += 1
            drained = list(self.ready)
            self.ready.clear()
            self._cond.notify()
            return drained

    def shrink(self) -> list[str]:
        """Forgets bursts older than BURST_MEMORY; returns the ready sandboxes then above the target (to delete)."""
        with self._cond:
            now = time.monotonic()
            self._end_burst(now)
            while self._bursts and now - self._bursts[0][0] > BURST_MEMORY:
                self._bursts.popleft()
            return self._trim()

    def _end_burst(self, now: float) -> None:
        """Files the burst under way once BURST_GAP passed without a claim (call holding the lock)."""
        if self._burst and now - self._last_take >= BURST_GAP:
            while self._bursts and self._bursts[-1][1] <= self._burst:
                self._bursts.pop()
            self._bursts.append((self._last_take, self._burst))
            self._burst = 0

    def _trim(self) -> list[str]:
        surplus = []
        while len(self.ready) > self.target:
            surplus.append(self.ready.pop())
        return surplus

    def wake(self) -> None:
        """Room was made on the node: retry a refill that waited for capacity."""
        with self._cond:
            self._retry_at = 0.0
            self._nudge(time.monotonic())

    def close(self) -> None:
        """Stops refilling and waits for starts in flight, so that the template can go once the pool has.
        What was started stays recorded, so a restarted node finds it again."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            self._cond.wait_for(lambda: self.starting == 0)

    def _wait(self, now: float) -> float | None:
        """Seconds until the pool should start one more sandbox: 0 now, None when only a change can tell."""
        target = self.target
        if len(self.ready) + self.starting >= target or self.starting >= self.resource.spec.refill_concurrency:
            return None
        quiet = 0.0 if len(self.ready) <= target // 4 else self._last_take + REFILL_QUIET - now
        return max(0.0, self._retry_at - now, quiet)

    def _nudge(self, now: float) -> None:
        """Wakes the refill thread if it would sleep past the moment it must act (call holding the lock)."""
        wait = self._wait(now)
        if wait is not None and now + wait < self._wakes_at:
            self._cond.notify()

    def _refill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (wait := self._wait(now := time.monotonic())) != 0:
                    self._wakes_at = math.inf if wait is None else now + wait
                    self._cond.wait(wait)
                self._wakes_at = 0.0
                if self._closed:
                    return
                self.starting += 1
                generation = self._generation
            self._submit(lambda generation=generation: self._start_one(generation))

    def _start_one(self, generation: int) -> None:
        container_id = None
        try:
            if not self._closed:
                container_id = self._launch(self)
        except CapacityExceeded:
            self._retry_after(_CAPACITY_RETRY)
        except Exception:
            log.exception("warm pool %s: starting a sandbox failed", self.name)
            self._backoff = min(max(self._backoff * 2, 0.5), _MAX_BACKOFF)
            self._retry_after(self._backoff)
        else:
            self._backoff = 0.0
        with self._cond:
            self.starting -= 1
            stale = container_id is not None and generation != self._generation
            if container_id is not None and not stale:
                self.ready.append(container_id)
            self._cond.notify_all()
        if stale:
            self._discard(container_id)  # type: ignore[arg-type]
        elif container_id is not None:
            self._watch(container_id)

    def _retry_after(self, delay: float) -> None:
        with self._cond:
            self._retry_at = time.monotonic() + delay
