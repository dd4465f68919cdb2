"""Volumes benchmark: what a named volume costs to make, to delete, and to mount into a container as it starts.

A volume is a sparse image made a filesystem with mkfs.ext4 and loop-mounted (engine/volumes.py). Making one
is timed at three sizes (the cost should not grow with the size: inode tables and journal are zeroed lazily);
a container's start with a volume bound in is timed against the same start without one, in turns, in one run.
Writing through the volume is timed against writing to the container's own disk (a tmpfs upper) as a reference.

Run: `.venv/bin/python bench/volumes.py [--quick]`. Prints a table and, as its last line, one JSON object of the
figures (milliseconds), with `missed`: the targets not met.
"""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.table import Table

from common import TEMPLATE, Figures, distribution, machine, progress_bars, succeed, throwaway_engine, timed
from rollbox._signals import exit_on_sigterm
from rollbox.engine import Engine

SIZES = {"64Mi": 64 * 2**20, "1Gi": 2**30, "16Gi": 16 * 2**30}
TARGETS = {"create_p50_ms": 100.0, "mount_overhead_p50_ms": 10.0}
"""A volume made in a tenth of a second whatever its size; a volume adds at most 10 ms to a container's start."""


def create_delete(engine: Engine, count: int) -> Figures:
    figures: Figures = {}
    for label, size in SIZES.items():
        made, deleted = [], []
        for i in range(count):
            start = time.perf_counter()
            volume = engine.volumes.create(f"bench/{label.lower()}-{i}", size)
            made.append((time.perf_counter() - start) * 1000)
            deleted.append(timed(lambda volume=volume: engine.delete_volume(volume.key)))
        figures[label] = {"create_ms": distribution(made), "delete_ms": distribution(deleted)}
    return figures


def starts(engine: Engine, count: int) -> Figures:
    """Container starts with and without a volume, in turns, so that both meet the same moments of the machine."""
    volume = engine.volumes.create("bench/start", 64 * 2**20)
    plain, mounted = [], []
    engine.create(TEMPLATE).delete()
    for _ in range(count):
        start = time.perf_counter()
        box = engine.create(TEMPLATE)
        plain.append((time.perf_counter() - start) * 1000)
        box.delete()
        start = time.perf_counter()
        box = engine.create(TEMPLATE, volume_mounts=[(volume.key, "/workspace", False)])
        mounted.append((time.perf_counter() - start) * 1000)
        box.delete()
    engine.delete_volume(volume.key)
    return {"start_ms": distribution(plain), "start_with_volume_ms": distribution(mounted)}


def writes(engine: Engine) -> Figures:
    """64 MiB written and synced, to a volume and to the container's own disk."""
    volume = engine.volumes.create("bench/writes", 256 * 2**20)
    with engine.create(TEMPLATE, volume_mounts=[(volume.key, "/workspace", False)]) as box:
        def write(path: str) -> float:
            return timed(lambda: succeed(box, f"dd if=/dev/zero of={path} bs=1M count=64 conv=fsync 2>/dev/null"
                                              f" && rm {path}"))
        figures = {"write_64mb_volume_ms": round(min(write("/workspace/f") for _ in range(3)), 1),
                   "write_64mb_own_disk_ms": round(min(write("/tmp/f") for _ in range(3)), 1)}
    engine.delete_volume(volume.key)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (well under a minute)")
    args = parser.parse_args()
    exit_on_sigterm()
    count = 5 if args.quick else 20
    figures: Figures = {"machine": machine()}
    with progress_bars() as progress, throwaway_engine() as engine:
        task = progress.add_task("volumes", total=3)
        figures["sizes"] = create_delete(engine, count)
        progress.advance(task)
        figures.update(starts(engine, count * 2))
        progress.advance(task)
        figures.update(writes(engine))
        progress.advance(task)
    overhead = figures["start_with_volume_ms"]["p50"] - figures["start_ms"]["p50"]
    figures["mount_overhead_p50_ms"] = round(overhead, 3)
    create_p50 = max(size["create_ms"]["p50"] for size in figures["sizes"].values())
    missed = [name for name, value in (("create_p50_ms", create_p50), ("mount_overhead_p50_ms", overhead))
              if value > TARGETS[name]]
    table = Table("what", "p50 ms", "p99 ms", box=None, header_style="bold")
    for label, size in figures["sizes"].items():
        table.add_row(f"create {label}", str(size["create_ms"]["p50"]), str(size["create_ms"]["p99"]))
        table.add_row(f"delete {label}", str(size["delete_ms"]["p50"]), str(size["delete_ms"]["p99"]))
    for name in ("start_ms", "start_with_volume_ms"):
        table.add_row(name.removesuffix("_ms").replace("_", " ") + " (baseline)" * (name == "start_ms"),
                      str(figures[name]["p50"]), str(figures[name]["p99"]))
    table.add_row("64 MiB written + fsync: volume", str(figures["write_64mb_volume_ms"]), "")
    table.add_row("64 MiB written + fsync: own disk (baseline)", str(figures["write_64mb_own_disk_ms"]), "")
    Console().print(table)
    print(json.dumps({**figures, "targets": TARGETS, "missed": missed}))


if __name__ == "__main__":
    main()
