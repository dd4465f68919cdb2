"""Cost per claim: the CPU-seconds, memory and disk GB-seconds and wall time a claim has used since it began.

CPU comes from the cgroup's CPU counter, which counts by itself: the claim's share is the counter now less
what it read when the claim took the container (a warm container's start is not the claim's), plus what the
claim's earlier containers used before a reset swapped them out. Memory and disk have no such counter, only
a level, so a thread of the node samples them and integrates by trapezoids: every BUSY_EVERY seconds for a
claim with a call in flight (and once more after the call), every IDLE_EVERY seconds for one without (whose
levels barely move), and once more as the claim ends or its stats are asked for. What ended claims used is
kept per tenant in `ended`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable

from rollbox.engine import Engine
from rollbox.engine.accounting import Usage
from rollbox.errors import SandboxNotFound
from rollbox.models import ClaimCost

log = logging.getLogger("rollbox.node")

BUSY_EVERY = 0.1
"""Seconds between two samples of a claim that runs a command or another call."""
IDLE_EVERY = 1.0
"""Seconds between two samples of a claim that runs nothing."""
GB = 1e9


class Meter:
    """One claim's running account. Its lock orders the samples of the node's thread and of the calls."""

    def __init__(self, container_id: str, start: Usage, started: float) -> None:
        self.lock = threading.Lock()
        self.container_id = container_id
        """The container that serves the claim now."""
        self.cgroup = start.cgroup
        self.cpu_base = start.cpu_seconds
        """The counter of the current cgroup when the claim took it."""
        self.cpu_last = start.cpu_seconds
        self.cpu_before = 0.0
        """CPU-seconds of the cgroups the claim had before the current one."""
        self.started = self.last = started
        self.memory = self.disk = 0
        self.memory_gb_seconds = self.disk_gb_seconds = 0.0
        self.memory_peak = self.disk_peak = 0
        self.samples = 0
        self.busy = False
        """A call was in flight at the last sample: the next one comes BUSY_EVERY later, ended or not, so that
        the levels' drop after a command is seen as soon as its rise was."""

    def add(self, usage: Usage, now: float) -> None:
        """Takes one sample: the levels integrate since the last one (from the claim's start, the first)."""
        if usage.cgroup != self.cgroup:  # restarted in place: a new cgroup, whose counter started at zero
            self._switched(usage, 0.0)
        self.cpu_last = usage.cpu_seconds
        span = now - self.last
        if self.samples:
            self.memory_gb_seconds += (self.memory + usage.memory_bytes) / 2 * span / GB
            self.disk_gb_seconds += (self.disk + usage.disk_bytes) / 2 * span / GB
        else:  # the claim's first sample stands for its level since the claim began
            self.memory_gb_seconds += usage.memory_bytes * span / GB
            self.disk_gb_seconds += usage.disk_bytes * span / GB
        self.memory, self.disk, self.last = usage.memory_bytes, usage.disk_bytes, now
        self.memory_peak, self.disk_peak = max(self.memory_peak, self.memory), max(self.disk_peak, self.disk)
        self.samples += 1

    def switch(self, old: Usage, now: float, new: Usage) -> None:
        """A reset gave the claim another container: the old one's last sample, then the new one's counter."""
        self.add(old, now)
        self._switched(new, new.cpu_seconds)

    def _switched(self, new: Usage, base: float) -> None:
        self.cpu_before += self.cpu_last - self.cpu_base
        self.cgroup, self.cpu_base, self.cpu_last = new.cgroup, base, new.cpu_seconds

    def cost(self, now: float) -> ClaimCost:
        return ClaimCost(cpu_seconds=self.cpu_before + self.cpu_last - self.cpu_base,
                         memory_gb_seconds=self.memory_gb_seconds, disk_gb_seconds=self.disk_gb_seconds,
                         wall_seconds=now - self.started, memory_peak_bytes=self.memory_peak,
                         disk_peak_bytes=self.disk_peak, samples=self.samples)


class CostMeters:
    """The accounts of a node's claims, by sandbox id, and a thread that samples them until the node closes.

    `busy(sandbox_id)` tells whether a claim has a call in flight (sampled more often); `warm()` lists the warm
    containers, whose CPU counters the thread reads ahead, so that a warm claim starts its account without reading
    a file on its hot path (an idle container's counter does not move while it waits)."""

    def __init__(self, engine: Engine, busy: Callable[[str], bool], warm: Callable[[], Iterable[str]],
                 closed: threading.Event) -> None:
        self.engine = engine
        self._busy = busy
        self._warm = warm
        self._warm_counters: dict[str, Usage] = {}
        self._closed = closed
        self.meters: dict[str, Meter] = {}
        self.ended: dict[str, ClaimCost] = {}
        """What the ended claims of each tenant used, summed."""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="rollbox-cost", daemon=True)
        self._thread.start()

    def open(self, sandbox_id: str, container_id: str) -> None:
        """Starts a claim's account from its container's CPU counter, as read ahead while it was warm, else now."""
        start = self._warm_counters.get(container_id)
        with contextlib.suppress(SandboxNotFound, OSError):
            start = start or self.engine.usage(container_id, cpu_only=True)
            self.meters[sandbox_id] = Meter(container_id, start, time.monotonic())

    def switch(self, sandbox_id: str, container_id: str) -> None:
        """The claim now runs on `container_id` (a reset); call before its old container goes."""
        meter = self.meters.get(sandbox_id)
        if meter is None:
            return
        with meter.lock, contextlib.suppress(SandboxNotFound, OSError):
            meter.switch(self.engine.usage(meter.container_id), time.monotonic(),
                         self.engine.usage(container_id, cpu_only=True))
            meter.container_id = container_id

    def cost(self, sandbox_id: str) -> ClaimCost | None:
        """The claim's cost so far, with a sample taken now."""
        meter = self.meters.get(sandbox_id)
        return None if meter is None else self._sampled(meter)

    def close(self, sandbox_id: str, tenant: str) -> ClaimCost | None:
        """Ends a claim's account (call before its container goes) and adds it to its tenant's total."""
        meter = self.meters.pop(sandbox_id, None)
        if meter is None:
            return None
        cost = self._sampled(meter)
        with self._lock:
            total = self.ended.get(tenant) or ClaimCost()
            self.ended[tenant] = ClaimCost(**{name: getattr(total, name) + value if "peak" not in name
                                              else max(getattr(total, name), value)
                                              for name, value in cost.model_dump().items()})
        return cost

    def _sampled(self, meter: Meter) -> ClaimCost:
        with meter.lock:
            now = time.monotonic()
            with contextlib.suppress(SandboxNotFound, OSError):
                meter.add(self.engine.usage(meter.container_id), now)
            return meter.cost(now)

    def _read_warm(self) -> None:
        counters = {}
        for container_id in list(self._warm()):
            with contextlib.suppress(SandboxNotFound, OSError):
                counters[container_id] = self.engine.usage(container_id, cpu_only=True)
        self._warm_counters = counters

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        read_warm = 0.0
        while not self._closed.wait(BUSY_EVERY):
            if time.monotonic() - read_warm >= IDLE_EVERY:
                read_warm = time.monotonic()
                self._read_warm()
            for sandbox_id, meter in list(self.meters.items()):
                busy = self._busy(sandbox_id)
                if not (busy or meter.busy or time.monotonic() - meter.last >= IDLE_EVERY):
                    continue
                meter.busy = busy
                with meter.lock:
                    try:
                        meter.add(self.engine.usage(meter.container_id), time.monotonic())
                    except (SandboxNotFound, OSError):
                        pass
                    except Exception:
                        log.exception("sampling the cost of sandbox %s failed", sandbox_id)
