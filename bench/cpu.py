"""CPU time and CPU placement of this process and the embedded server's, for the server and RL benchmarks."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common import Figures, distribution

TICKS = os.sysconf("SC_CLK_TCK")


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

    def figures(self) -> Figures:
        count = len(self.latencies) + len(self.cold)
        per_op = 1000 / max(count, 1)
        latencies = distribution(self.latencies) if self.latencies else {"p50": None, "p99": None, "n": 0}
        return {**latencies, "per_s": round(count / self.wall, 1),
                "client_cpu_ms": round(self.client_cpu * per_op, 3),
                "server_cpu_ms": round(self.server_cpu * per_op, 3) if self.server else None,
                "cold": len(self.cold), "cold_p50": distribution(self.cold)["p50"] if self.cold else None,
                "load": round(self.load or 0.0, 2), "cpus_apart": bool(self.apart and self.server)}
