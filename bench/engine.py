"""Engine benchmark: what each sandbox operation costs on this machine, next to plain baselines.

Run as root: `.venv/bin/python bench/engine.py [--quick]`. It makes a throw-away engine, measures,
removes every container, mount and cgroup it made, prints a table and, as its last line, one JSON
object of every figure (milliseconds, per second, MB = 2**20 bytes) for scripts to read.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from common import (
    MB,
    TEMPLATE,
    Figures,
    create_delete,
    distribution,
    load,
    machine,
    meminfo,
    progress_bars,
    python_throughput,
    repeat,
    succeed,
    throwaway_engine,
    timed,
)
from rollbox._signals import exit_on_sigterm
from rollbox.engine import Container, Engine

FORK_SIZES_MB = (1, 200)


@dataclass(frozen=True)
class Plan:
    """How many samples each phase takes: `--quick` keeps the whole run under a minute."""

    subprocess: int
    exec: int
    runc_exec: int
    create: int
    python_runs: int
    python_sandboxes: int
    reset: int
    fork_rounds: int
    pause: int
    density: int
    workers: int


QUICK = Plan(subprocess=200, exec=300, runc_exec=20, create=10, python_runs=120, python_sandboxes=4, reset=10,
             fork_rounds=3, pause=50, density=50, workers=4)
FULL = Plan(subprocess=1000, exec=2000, runc_exec=100, create=100, python_runs=1000, python_sandboxes=4, reset=50,
            fork_rounds=10, pause=300, density=1000, workers=4)

TARGETS: dict[str, tuple[str, Callable[[Figures], bool]]] = {
    "exec_true_ms": ("p50 <= 2 ms", lambda f: f["exec_true_ms"]["p50"] <= 2),
    "exec_true_vs_subprocess": ("<= 3x", lambda f: f["exec_true_vs_subprocess"] <= 3),
    "create_ms": ("p50 <= 60 ms", lambda f: f["create_ms"]["p50"] <= 60),
    "fork4_1mb_ms": ("<= 150 ms", lambda f: f["fork4_1mb_ms"]["p50"] <= 150),
    "fork4_200mb_ms": ("<= 150 ms, same as 1 MB",
                       lambda f: f["fork4_200mb_ms"]["p50"] <= max(150, 1.2 * f["fork4_1mb_ms"]["p50"])),
    "density_mb_per_sandbox": ("<= 8 MB", lambda f: f["density_mb_per_sandbox"] <= 8),
    "python_per_s": (">= 60/s", lambda f: f["python_per_s"] >= 60),
}


# -- phases -----------------------------------------------------------------------------------

def baselines(engine: Engine, box: Container, plan: Plan, progress: Progress) -> Figures:
    """Plain `subprocess.run`, raw `runc exec` into the same container, and the engine's exec."""
    runtime = engine.runtime("runc")
    record = engine.store.container(box.id)
    assert record is not None
    runc_exec = [runtime.binary, "--root", str(runtime.state_root), "exec", record.oci_id, "true"]
    subprocess.run(runc_exec, check=True)
    succeed(box, "true")
    if succeed(box, "echo hi") != "hi\n":
        raise RuntimeError("`echo hi` did not print hi")
    figures = {
        "subprocess_true_ms": repeat(progress, "subprocess.run(true)", plan.subprocess,
                                     lambda: subprocess.run(["true"], check=True)),
        "runc_exec_true_ms": repeat(progress, "runc exec true", plan.runc_exec,
                                    lambda: subprocess.run(runc_exec, check=True)),
        "exec_true_ms": repeat(progress, "engine exec true", plan.exec, lambda: box.exec(["true"])),
        "exec_echo_ms": repeat(progress, "engine exec echo hi", plan.exec, lambda: box.exec("echo hi")),
        "exec_true_isolated_ms": repeat(progress, "engine exec true, isolated", plan.exec // 4,
                                        lambda: box.exec(["true"], isolated=True)),
    }
    return {name: distribution(samples) for name, samples in figures.items()}


def reset_pause(engine: Engine, plan: Plan, progress: Progress) -> Figures:
    with engine.create(TEMPLATE) as box:
        reset = repeat(progress, "reset", plan.reset, box.reset)
        task = progress.add_task("pause + resume", total=plan.pause)
        paused, resumed = [], []
        for _ in range(plan.pause):
            paused.append(timed(box.pause))
            resumed.append(timed(box.resume))
            progress.advance(task)
        succeed(box, "true")
    return {"reset_ms": distribution(reset), "pause_ms": distribution(paused), "resume_ms": distribution(resumed)}


def fork_once(engine: Engine, megabytes: int) -> float:
    """Writes `megabytes` into a new sandbox, times fork(4), and checks a child sees the file."""
    with engine.create(TEMPLATE) as parent:
        succeed(parent, f"dd if=/dev/zero of=/tmp/state bs=1M count={megabytes} status=none")
        start = time.perf_counter()
        children = parent.fork(4)
        elapsed = (time.perf_counter() - start) * 1000
        try:
            if succeed(children[-1], "stat -c %s /tmp/state").strip() != str(megabytes * MB):
                raise RuntimeError("a forked child does not see its parent's state")
        finally:
            for child in children:
                child.delete()
    return elapsed


def forks(engine: Engine, plan: Plan, progress: Progress) -> Figures:
    figures = {}
    for megabytes in FORK_SIZES_MB:
        task = progress.add_task(f"fork(4) over {megabytes} MB", total=plan.fork_rounds)
        samples = []
        for _ in range(plan.fork_rounds):
            samples.append(fork_once(engine, megabytes))
            progress.advance(task)
        figures[f"fork4_{megabytes}mb_ms"] = distribution(samples)
    return figures


def in_parallel(progress: Progress, label: str, workers: int, items: list[Any],
                action: Callable[[Any], Any]) -> list[Any]:
    task = progress.add_task(label, total=len(items))

    def step(item: Any) -> Any:
        result = action(item)
        progress.advance(task)
        return result

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(step, items))


def density(engine: Engine, plan: Plan, progress: Progress) -> Figures:
    """Host memory per idle sandbox: the drop in MemAvailable (and growth of kernel slab) over N of them."""
    gc.collect()
    time.sleep(1.0)
    before = meminfo()
    start = time.perf_counter()
    boxes = in_parallel(progress, f"density: start {plan.density}", plan.workers, list(range(plan.density)),
                        lambda _: engine.create(TEMPLATE))
    created_s = time.perf_counter() - start
    time.sleep(1.0)
    after = meminfo()
    cgroup_bytes = statistics.mean(box.stats().memory_bytes for box in boxes[:20])
    start = time.perf_counter()
    in_parallel(progress, f"density: delete {plan.density}", plan.workers, boxes, Container.delete)
    deleted_s = time.perf_counter() - start
    count = len(boxes)
    return {
        "density_sandboxes": count,
        "density_mb_per_sandbox": round((before["MemAvailable"] - after["MemAvailable"]) / count / MB, 2),
        "density_slab_mb_per_sandbox": round((after["Slab"] - before["Slab"]) / count / MB, 2),
        "density_cgroup_mb_per_sandbox": round(cgroup_bytes / MB, 2),
        "density_create_per_s": round(count / created_s, 1),
        "density_delete_per_s": round(count / deleted_s, 1),
    }


def measure(plan: Plan) -> Figures:
    figures: Figures = {"machine": machine()}
    with progress_bars() as progress, throwaway_engine() as engine:
        with engine.create(TEMPLATE) as box:
            figures.update(baselines(engine, box, plan, progress))
        figures["exec_true_vs_subprocess"] = round(
            figures["exec_true_ms"]["p50"] / figures["subprocess_true_ms"]["p50"], 2)
        figures.update(create_delete(engine, plan.create, progress))
        figures.update(python_throughput(engine, plan.python_runs, plan.python_sandboxes, progress))
        figures.update(reset_pause(engine, plan, progress))
        figures.update(forks(engine, plan, progress))
        figures.update(density(engine, plan, progress))
    figures["machine"]["load_after"] = load()
    return figures


# -- report -----------------------------------------------------------------------------------

def verdict(name: str, figures: Figures) -> str:
    if name not in TARGETS:
        return ""
    text, met = TARGETS[name]
    return f"[green]{text} ok[/]" if met(figures) else f"[red]{text} MISSED[/]"


def table(figures: Figures) -> Table:
    m = figures["machine"]
    report = Table(title=f"rollbox engine benchmark ({figures['mode']}, {figures['elapsed_s']} s)",
                   caption=f"{m['cores']} cores, {m['memory_mb']} MB, Linux {m['kernel']}, runc {m['runc']}; "
                           f"load {m['load_before']} before, {m['load_after']} after")
    report.add_column("measurement", no_wrap=True)
    for column in ("p50", "p99", "n"):
        report.add_column(column, justify="right")
    report.add_column("target")
    for name, value in figures.items():
        if name in ("machine", "mode", "elapsed_s"):
            continue
        if isinstance(value, dict):
            report.add_row(name, f"{value['p50']:.2f}", f"{value['p99']:.2f}", str(value["n"]), verdict(name, figures))
        else:
            report.add_row(name, f"{value}", "", "", verdict(name, figures))
    return report


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and 50 sandboxes: under a minute")
    parser.add_argument("--density", type=int, help="idle sandboxes to start for the density figure")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.density:
        plan = replace(plan, density=args.density)
    start = time.perf_counter()
    figures = measure(plan)
    figures["mode"] = "quick" if args.quick else "full"
    figures["elapsed_s"] = round(time.perf_counter() - start, 1)
    Console().print(table(figures))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
