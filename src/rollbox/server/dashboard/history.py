"""What the dashboard charts and an admin reads back: recent latencies and each sandbox's last commands.

Both are bounded whatever the load: latencies land in a ring of time slots, each slot a fixed log-scale
histogram (so a slot's median and p99 cost no samples kept), and commands in a short deque per sandbox,
with the number of sandboxes remembered capped too (the oldest forgotten first).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass
from typing import Any

SLOT_SECONDS = 2
SLOTS = 300
"""Ten minutes of slots."""
BINS_PER_DECADE = 8
LOWEST = 1e-4
"""Seconds of the first bin's upper edge: faster than any call."""
BINS = BINS_PER_DECADE * 6
"""Up to 100 s; slower calls count in the last bin."""
COMMANDS_PER_SANDBOX = 50
SANDBOXES_REMEMBERED = 4096
COMMAND_CHARS = 1000
"""What of a command the log keeps: enough to recognise it, never a pasted file."""


class LatencyHistory:
    """Latencies of one kind of call over the last SLOTS * SLOT_SECONDS seconds."""

    def __init__(self) -> None:
        self._stamps = [-1] * SLOTS
        self._counts = [[0] * BINS for _ in range(SLOTS)]
        self._lock = threading.Lock()

    def add(self, seconds: float, now: float | None = None) -> None:
        epoch = int((time.time() if now is None else now) // SLOT_SECONDS)
        index = 0 if seconds <= LOWEST else min(BINS - 1, math.ceil(math.log10(seconds / LOWEST) * BINS_PER_DECADE))
        slot = epoch % SLOTS
        with self._lock:
            if self._stamps[slot] != epoch:
                self._stamps[slot] = epoch
                self._counts[slot] = [0] * BINS
            self._counts[slot][index] += 1

    def series(self, now: float | None = None) -> list[dict[str, Any]]:
        """One point per slot, oldest first, for the slots that saw calls: `{"t", "count", "p50", "p99"}`
        (t: the slot's start, Unix seconds; quantiles: the upper edge of their bin, seconds)."""
        last = int((time.time() if now is None else now) // SLOT_SECONDS)
        points = []
        with self._lock:
            for epoch in range(last - SLOTS + 1, last + 1):
                slot = epoch % SLOTS
                if self._stamps[slot] == epoch:
                    counts = list(self._counts[slot])
                    total = sum(counts)
                    points.append({"t": epoch * SLOT_SECONDS, "count": total, "p50": _quantile(counts, total, 0.5),
                                   "p99": _quantile(counts, total, 0.99)})
        return points


def _quantile(counts: list[int], total: int, q: float) -> float:
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return LOWEST * 10 ** (index / BINS_PER_DECADE)
    return LOWEST * 10 ** ((BINS - 1) / BINS_PER_DECADE)


@dataclass(frozen=True)
class Command:
    at: float
    tenant: str
    command: str
    exit_code: int | None
    duration_ms: float


class CommandLog:
    """The last COMMANDS_PER_SANDBOX commands of each sandbox, for admins; a sandbox's go when it is deleted."""

    def __init__(self) -> None:
        self._logs: OrderedDict[str, deque[Command]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, sandbox_id: str, tenant: str, command: str | list[str], exit_code: int | None,
            seconds: float) -> None:
        text = command if isinstance(command, str) else " ".join(command)
        entry = Command(time.time(), tenant, text[:COMMAND_CHARS], exit_code, round(seconds * 1000, 3))
        with self._lock:
            log = self._logs.get(sandbox_id)
            if log is None:
                log = self._logs[sandbox_id] = deque(maxlen=COMMANDS_PER_SANDBOX)
                if len(self._logs) > SANDBOXES_REMEMBERED:
                    self._logs.popitem(last=False)
            else:
                self._logs.move_to_end(sandbox_id)
            log.append(entry)

    def tail(self, sandbox_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(entry) for entry in self._logs.get(sandbox_id, ())]

    def drop(self, sandbox_id: str) -> None:
        with self._lock:
            self._logs.pop(sandbox_id, None)

    def keep_only(self, live: set[str]) -> None:
        """Forgets sandboxes that are gone without a delete call (expired, lost with their node)."""
        with self._lock:
            for sandbox_id in [known for known in self._logs if known not in live]:
                del self._logs[sandbox_id]


class Activity:
    """What the server's routes feed as they answer, read by the dashboard."""

    def __init__(self) -> None:
        self.claims = LatencyHistory()
        self.execs = LatencyHistory()
        self.commands = CommandLog()
