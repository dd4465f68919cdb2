"""Store benchmark: how long a commit of one claim takes while the disk is busy, rollbox's store against SQLite
checkpointing by itself.

Sandboxes starting and going keep the disk busy (layers written, removed, synced); the node commits
claims on the server's event loop, so a slow commit stalls every request. The baseline is a plain
SQLite connection set up for one writing process the usual way (WAL, synchronous=NORMAL, exclusive
locking), which checkpoints by itself every 1,000 pages, in the commit that crosses them. Both write the
same claim-sized rows, one per commit, in turns, while a `dd ... conv=fsync` loop writes to the same disk.

Run: `.venv/bin/python bench/store.py [--quick]`. Prints a table and, as its last line, one JSON object of
the figures (milliseconds), whose `missed` names rollbox's store if its p99 is not below the baseline's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common import Figures, distribution, machine, progress_bars
from rollbox._signals import exit_on_sigterm
from rollbox.engine.database import Database
from rollbox.node.store import SCHEMA

RECORD = "x" * 400
"""As long as a claim's stored record."""
SLOW_MS = 3.0
"""A commit slower than this holds up every request the event loop has meanwhile."""
PAUSE = 0.0002
"""Between two commits: the node commits at most a few thousand times a second."""
Commit = Callable[[int], None]
INSERT = "INSERT OR REPLACE INTO claims VALUES (?, ?)"


def rollbox_store(path: Path) -> tuple[Commit, Callable[[], None]]:
    store = Database(path, SCHEMA, exclusive=True)

    def commit(row: int) -> None:
        with store.transaction() as db:
            db.execute(INSERT, (f"{row:016x}", RECORD))

    return commit, store.close


def sqlite_alone(path: Path) -> tuple[Commit, Callable[[], None]]:
    db = sqlite3.connect(str(path), isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "locking_mode=EXCLUSIVE"):
        db.execute(f"PRAGMA {pragma}")
    db.executescript(SCHEMA)

    def commit(row: int) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute(INSERT, (f"{row:016x}", RECORD))
        db.execute("COMMIT")

    return commit, db.close


STORES = {"sqlite": sqlite_alone, "rollbox": rollbox_store}


@contextlib.contextmanager
def busy_disk(directory: Path) -> Iterator[None]:
    """64 MB written and synced over and over next to the store, until the block ends."""
    target = directory / "load"
    loop = f"while :; do dd if=/dev/zero of={target} bs=1M count=64 conv=fsync status=none; done"
    process = subprocess.Popen(["bash", "-c", loop])
    try:
        yield
    finally:
        process.kill()
        process.wait()
        target.unlink(missing_ok=True)


def commits(make: Callable[[Path], tuple[Commit, Callable[[], None]]], seconds: float) -> list[float]:
    """Commit latencies (ms) of one store on a fresh file for `seconds`."""
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-store-", dir="/var/tmp") as directory:
        commit, close = make(Path(directory) / "node.db")
        samples = []
        try:
            with busy_disk(Path(directory)):
                row, deadline = 0, time.monotonic() + seconds
                while time.monotonic() < deadline:
                    row += 1
                    started = time.perf_counter()
                    commit(row % 5000)
                    samples.append((time.perf_counter() - started) * 1000)
                    time.sleep(PAUSE)
        finally:
            close()
    return samples


def measure(seconds: float, rounds: int) -> Figures:
    samples: dict[str, list[float]] = {name: [] for name in STORES}
    with progress_bars() as progress:
        task = progress.add_task("commits under disk load", total=rounds * len(STORES))
        for _ in range(rounds):  # in turns, so that both meet the same moments of the machine
            for name, make in STORES.items():
                samples[name] += commits(make, seconds)
                progress.advance(task)
    figures: Figures = {"machine": machine(), "seconds": seconds * rounds}
    for name, latencies in samples.items():
        slow = sum(latency > SLOW_MS for latency in latencies)
        figures[f"commit_{name}"] = {**distribution(latencies), "max": round(max(latencies), 1),
                                     "slow_per_min": round(slow * 60 / (seconds * rounds), 1)}
    figures["missed"] = [] if figures["commit_rollbox"]["p99"] < figures["commit_sqlite"]["p99"] else ["commit_rollbox"]
    return figures


def table(figures: Figures) -> Table:
    out = Table(title=f"one claim per commit, disk busy ({figures['seconds']:.0f} s each)")
    for column in ("store", "p50 ms", "p99 ms", "max ms", f"commits > {SLOW_MS:.0f} ms per minute", "commits"):
        out.add_column(column, justify="left" if column == "store" else "right")
    labels = {"sqlite": "SQLite checkpointing by itself (baseline)", "rollbox": "rollbox store (checkpoint thread)"}
    for name, label in labels.items():
        row = figures[f"commit_{name}"]
        out.add_row(label, f"{row['p50']:.3f}", f"{row['p99']:.2f}", f"{row['max']:.1f}", f"{row['slow_per_min']:.1f}",
                    str(row["n"]))
    return out


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 s per store instead of 2 x 20 s")
    args = parser.parse_args()
    figures = measure(5.0, 1) if args.quick else measure(20.0, 2)
    figures["mode"] = "quick" if args.quick else "full"
    Console().print(table(figures))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
