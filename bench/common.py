"""What the benchmarks share: distributions of samples, the machine's description, a progress display, and a
throw-away engine with the two engine timings that bench/engine.py and bench/server.py both report."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import secrets
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollbox.engine import Container, Engine
from rollbox.engine.engine import RUN_ROOT
from rollbox.spec import SandboxTemplate

MB = 2**20
TEMPLATE = "bench"
"""The template every throw-away engine builds."""
PYTHON = "python3 -c 'print(1)'"

Figures = dict[str, Any]
Distribution = dict[str, float]


# -- statistics -------------------------------------------------------------------------------

def distribution(samples: list[float]) -> Distribution:
    """Median and p99 (nearest rank, so p99 of a few samples is their maximum)."""
    ordered = sorted(samples)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return {"p50": round(statistics.median(ordered), 3), "p99": round(p99, 3), "n": len(ordered)}


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def repeat(progress: Progress, label: str, count: int, action: Callable[[], object]) -> list[float]:
    task = progress.add_task(label, total=count)
    samples = []
    for _ in range(count):
        samples.append(timed(action))
        progress.advance(task)
    return samples


def progress_bars() -> Progress:
    """Progress on stderr, gone when done, so that stdout holds only the table and the JSON line."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=Console(stderr=True), transient=True)


# -- the machine ------------------------------------------------------------------------------

def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * 1024
    return fields


def machine() -> Figures:
    version = subprocess.run(["runc", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return {"cores": os.cpu_count(), "memory_mb": round(meminfo()["MemTotal"] / MB), "kernel": platform.release(),
            "runc": version.split()[-1] if version else "unknown",
            "load_before": load()}


def load() -> list[float]:
    """The 1, 5 and 15-minute load averages: others may be running tests on this machine."""
    return [round(x, 2) for x in os.getloadavg()]


# -- a throw-away engine ----------------------------------------------------------------------

@contextlib.contextmanager
def throwaway_engine() -> Iterator[Engine]:
    """An engine on a temporary data directory, with everything it made removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-") as root:
        engine = Engine(Path(root) / "data", run_dir=RUN_ROOT / f"bench-{secrets.token_hex(4)}")
        try:
            engine.build(SandboxTemplate.model_validate({"metadata": {"name": TEMPLATE}}))
            yield engine
        finally:
            teardown(engine)


def teardown(engine: Engine) -> None:
    """Same clean-up as the tests: everything of the engine on the machine."""
    engine.destroy()


def succeed(box: Container, command: str) -> str:
    result = box.exec(command)
    if result.exit_code != 0:
        raise RuntimeError(f"{command!r} failed in sandbox {box.id}: {result.stderr.strip()}")
    return result.stdout


# -- engine timings both the engine and the server benchmark report ------------------------------

def create_delete(engine: Engine, count: int, progress: Progress) -> Figures:
    engine.create(TEMPLATE).delete()  # warm the page cache and the runtime's state root
    task = progress.add_task("create + delete", total=count)
    created, deleted = [], []
    for _ in range(count):
        start = time.perf_counter()
        box = engine.create(TEMPLATE)
        created.append((time.perf_counter() - start) * 1000)
        deleted.append(timed(box.delete))
        progress.advance(task)
    return {"create_ms": distribution(created), "delete_ms": distribution(deleted)}


def python_throughput(engine: Engine, runs: int, sandboxes: int, progress: Progress) -> Figures:
    """Sustained `python3 -c 'print(1)'` per second: one thread per sandbox keeps every core busy."""
    boxes = [engine.create(TEMPLATE) for _ in range(sandboxes)]
    try:
        for box in boxes:
            succeed(box, PYTHON)
        task = progress.add_task(f"{PYTHON} x {len(boxes)} threads", total=runs)
        per_box = runs // len(boxes)

        def run(box: Container) -> list[float]:
            samples = []
            for _ in range(per_box):
                samples.append(timed(lambda: succeed(box, PYTHON)))
                progress.advance(task)
            return samples

        start = time.perf_counter()
        with ThreadPoolExecutor(len(boxes)) as pool:
            latencies = [sample for samples in pool.map(run, boxes) for sample in samples]
        elapsed = time.perf_counter() - start
    finally:
        for box in boxes:
            box.delete()
    return {"python_per_s": round(len(latencies) / elapsed, 1), "python_ms": distribution(latencies)}
