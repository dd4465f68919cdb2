"""Engine benchmark: what each sandbox operation costs on this machine, next to plain baselines.

Run as root: `.venv/bin/python bench/engine.py [--quick]`. It makes a throw-away engine, measures,
removes every container, mount and cgroup it made, prints a table and, as its last line, one JSON
object of every figure (milliseconds, per second, MB = 2**20 bytes) for scripts to read, with the
targets not met in `missed`.

The `live_` figures are gVisor's processes and memory (docs/checkpoints.md): live fork, checkpoint and
standby of a sandbox whose Python process holds 100 MB, next to the file-only fork of runc (`fork4_`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
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
from rollbox.engine.runtimes import Runtime
from rollbox.spec import SandboxTemplate

FORK_SIZES_MB = (1, 200)
GVISOR = "bench-gvisor"
"""The template of the live phases: the defaults (1 core, 512 MB, 1 GB of disk) under gVisor."""
HELD_MB = 100
HOLDER_PORT = 7000
HOLDER = f"""
import os, socket, zlib
held = bytearray(os.urandom({HELD_MB} * 2**20))
secret = os.urandom(8).hex()
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", {HOLDER_PORT}))
server.listen()
while True:
    conn, _ = server.accept()
    conn.recv(16)
    conn.sendall(f"{{secret}} {{zlib.crc32(held):08x}}".encode())
    conn.close()
"""
"""The live phases' Python process: holds 100 MB of random bytes (which no checkpoint can compress away) and a
secret, and answers both (the secret, and the CRC-32 of every held byte) on the sandbox's loopback."""
READ_STATE = ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{HOLDER_PORT}; echo sum >&3; cat <&3"]
"""The command that reads the holder's in-memory state (bash's /dev/tcp: no Python to start)."""


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
    live_fork4: int
    """Live forks 1 -> 4, each of a new holder."""
    live_fork16: int
    standby: int
    """Standby and resume rounds of one holder, and of an idle gVisor sandbox."""


QUICK = Plan(subprocess=200, exec=300, runc_exec=20, create=10, python_runs=120, python_sandboxes=4, reset=10,
             fork_rounds=3, pause=50, density=50, workers=4, live_fork4=3, live_fork16=2, standby=3)
FULL = Plan(subprocess=1000, exec=2000, runc_exec=100, create=100, python_runs=1000, python_sandboxes=4, reset=50,
            fork_rounds=10, pause=300, density=1000, workers=4, live_fork4=10, live_fork16=5, standby=10)

TARGETS: dict[str, tuple[str, Callable[[Figures], bool]]] = {
    "exec_true_ms": ("p50 <= 2 ms", lambda f: f["exec_true_ms"]["p50"] <= 2),
    "exec_true_vs_subprocess": ("<= 3x", lambda f: f["exec_true_vs_subprocess"] <= 3),
    "create_ms": ("p50 <= 60 ms", lambda f: f["create_ms"]["p50"] <= 60),
    "fork4_1mb_ms": ("<= 150 ms", lambda f: f["fork4_1mb_ms"]["p50"] <= 150),
    "fork4_200mb_ms": ("<= 150 ms, same as 1 MB",
                       lambda f: f["fork4_200mb_ms"]["p50"] <= max(150, 1.2 * f["fork4_1mb_ms"]["p50"])),
    "density_mb_per_sandbox": ("<= 8 MB", lambda f: f["density_mb_per_sandbox"] <= 8),
    "python_per_s": (">= 60/s", lambda f: f["python_per_s"] >= 60),
    "live_fork4_ms": ("p50 <= 600 ms", lambda f: f["live_fork4_ms"]["p50"] <= 600),
    "live_fork16_vs_fork4": ("<= 3x", lambda f: f["live_fork16_vs_fork4"] <= 3),
    "live_checkpoint_mb_per_s": (">= 300 MB/s", lambda f: f["live_checkpoint_mb_per_s"] >= 300),
    "live_resume_first_command_ms": ("p50 <= 250 ms", lambda f: f["live_resume_first_command_ms"]["p50"] <= 250),
    "live_standby_memory_ratio": ("<= 0.05 of running", lambda f: f["live_standby_memory_ratio"] <= 0.05),
}

NOTES = {
    "fork4_1mb_ms": "runc, file-only fork: live fork's baseline",
    "live_fork4_ms": f"gVisor, Python holding {HELD_MB} MB of random bytes: fork(4), call to return",
    "live_fork4_read_ms": "then the 4 children read it (secret, CRC-32 of 100 MB) at once; all checked",
    "live_fork4_answered_ms": "fork(4) call until all 4 children have answered that read",
    "live_fork4_restore_ms": "in it: each runsc restore (parent + 4 children, in parallel)",
    "live_fork4_other_ms": "in it: the rest (fork minus runsc checkpoint and slowest restore)",
    "live_fork4_restore_cpu_s": "CPU-seconds of each child's cgroup at the fork's return",
    "live_fork4_vs_file_fork4": "live_fork4 p50 / fork4_1mb p50",
    "live_fork16_ms": "fork(16) of the same, call to return; all 16 children's reads checked",
    "live_checkpoint_ms": "runsc checkpoint alone, in every live fork and standby",
    "live_checkpoint_mb_per_s": "median over them of live_resident_mb / checkpoint time",
    "live_resident_mb": "the sandbox's memory cgroup before the checkpoint",
    "live_image_mb": "its checkpoint image on disk",
    "live_standby_pause_ms": "pause(): checkpoint to disk, stop",
    "live_resume_first_command_ms": "first command after standby (`true`), call to answer; state checked after",
    "live_resume_restore_ms": "in it: runsc restore",
    "live_resume_idle_ms": "the same for a gVisor sandbox running nothing of its own",
    "live_running_memory_mb": "running, before each standby: its memory cgroup (after a restore: + the image read)",
    "live_standby_memory_mb": "standby: memory cgroup (gone: 0) + RSS of processes naming its bundle + its tmpfs upper",
    "live_standby_memory_ratio": "standby / running (the image's pages in the page cache not counted: reclaimable)",
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


# -- gVisor: processes and memory --------------------------------------------------------------

class RunscClock:
    """Times runsc's own calls inside the engine's operations (each `runsc checkpoint` and `runsc restore`) by
    wrapping the engine's runsc runtime object while the block runs, so that a figure splits into what runsc takes
    and what the engine adds. Nothing of the engine changes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.checkpoints: list[float] = []
        self.restores: list[float] = []

    def clear(self) -> None:
        self.checkpoints.clear()
        self.restores.clear()

    def __enter__(self) -> RunscClock:
        checkpoint, start = self.runtime.checkpoint, self.runtime.start

        def timed_checkpoint(*args: Any, **kwargs: Any) -> None:
            begun = time.perf_counter()
            try:
                checkpoint(*args, **kwargs)
            finally:
                self.checkpoints.append((time.perf_counter() - begun) * 1000)

        def timed_start(oci_id: str, bundle: Path, listener_fd: int | None, log: Path,
                        image: Path | None = None) -> None:
            begun = time.perf_counter()
            try:
                start(oci_id, bundle, listener_fd, log, image)
            finally:
                if image is not None:
                    self.restores.append((time.perf_counter() - begun) * 1000)  # list.append: thread-safe

        setattr(self.runtime, "checkpoint", timed_checkpoint)  # noqa: B010 (an instance's method, for this block)
        setattr(self.runtime, "start", timed_start)  # noqa: B010
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        del self.runtime.checkpoint, self.runtime.start


def start_holder(engine: Engine, timeout: float = 60.0) -> tuple[Container, str]:
    """A gVisor sandbox running HOLDER, and what it answers."""
    box = engine.create(GVISOR)
    try:
        box.files.write("/tmp/holder.py", HOLDER)
        succeed(box, "nohup python3 /tmp/holder.py >/dev/null 2>&1 &")
        deadline = time.monotonic() + timeout
        while not (answer := box.exec(READ_STATE).stdout.strip()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the holder in sandbox {box.id} never answered")
            time.sleep(0.05)
    except BaseException:
        box.delete()
        raise
    return box, answer


def read_state(boxes: list[Container], expected: str) -> float:
    """Every sandbox reads its holder's state at once; milliseconds until the last answer, each checked."""
    start = time.perf_counter()
    with ThreadPoolExecutor(len(boxes)) as pool:
        answers = list(pool.map(lambda box: box.exec(READ_STATE).stdout.strip(), boxes))
    elapsed = (time.perf_counter() - start) * 1000
    wrong = [box.id for box, answer in zip(boxes, answers, strict=True) if answer != expected]
    if wrong:
        raise RuntimeError(f"sandboxes {wrong} do not hold their parent's memory ({expected!r} expected)")
    return elapsed


def memory_cgroup_dir(engine: Engine, box: Container) -> Path:
    record = engine.store.container(box.id)
    assert record is not None
    relative = engine.cgroups.path_for(record.oci_id).lstrip("/")
    return Path("/sys/fs/cgroup") / relative if engine.cgroups.v2 else Path("/sys/fs/cgroup/memory") / relative


def cgroup_memory(engine: Engine, box: Container) -> int:
    """Bytes the sandbox's memory cgroup holds (the sentry, its memory file, the ptrace stubs, the tmpfs upper):
    memory.usage_in_bytes (v1) or memory.current (v2); 0 without a cgroup (a container in standby has none)."""
    name = "memory.current" if engine.cgroups.v2 else "memory.usage_in_bytes"
    try:
        return int((memory_cgroup_dir(engine, box) / name).read_text())
    except OSError:
        return 0


def bundle_rss(engine: Engine, box: Container) -> int:
    """The RSS of every host process naming the sandbox's bundle (runsc's sandbox and gofer): what is left of a
    container in standby, if anything."""
    bundle, total = str(engine.launcher.bundle_dir / box.id), 0
    for entry in os.scandir("/proc"):
        try:
            if not entry.name.isdigit() or bundle not in Path(entry.path, "cmdline").read_bytes().decode(
                    errors="replace"):
                continue
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


def upper(engine: Engine, box: Container) -> int:
    """Bytes of the files the sandbox wrote: its upper is a tmpfs, in memory, and stays mounted in standby."""
    record = engine.store.container(box.id)
    assert record is not None
    return engine.layers.upper_bytes(record.upper)


def live_fork_once(engine: Engine, clock: RunscClock, count: int, samples: dict[str, list[float]]) -> None:
    """Times fork(count) of a new holder; its children's reads of the parent's state are checked (timed for 4)."""
    parent, state = start_holder(engine)
    try:
        resident = cgroup_memory(engine, parent)
        clock.clear()
        start = time.perf_counter()
        children = parent.fork(count)
        elapsed = (time.perf_counter() - start) * 1000
        try:
            cpu = [child.stats().cpu_seconds for child in children]
            read = read_state(children, state)
            read_state([parent], state)
        finally:
            for child in children:
                child.delete()
    finally:
        parent.delete()
    samples[f"fork{count}"].append(elapsed)
    samples["checkpoint"] += clock.checkpoints
    samples["resident"].append(resident)
    samples["throughput"] += [resident / MB / (ms / 1000) for ms in clock.checkpoints]
    if count == 4:
        samples["read"].append(read)
        samples["answered"].append(elapsed + read)
        samples["restore"] += clock.restores
        samples["restore_cpu"] += cpu
        samples["other"].append(elapsed - sum(clock.checkpoints) - max(clock.restores))


def standby_rounds(engine: Engine, clock: RunscClock, box: Container, rounds: int, state: str | None,
                   samples: dict[str, list[float]], prefix: str) -> None:
    """Pauses the sandbox to disk and times the first command after, `rounds` times."""
    for _ in range(rounds):
        running = cgroup_memory(engine, box)
        clock.clear()
        samples[f"{prefix}pause"].append(timed(box.pause))
        if box.info.state != "standby":
            raise RuntimeError(f"sandbox {box.id} is {box.info.state} after pause, not in standby")
        samples[f"{prefix}standby"].append(cgroup_memory(engine, box) + bundle_rss(engine, box) + upper(engine, box))
        samples[f"{prefix}running"].append(running)
        samples[f"{prefix}image"].append(engine.checkpoints.used())
        start = time.perf_counter()
        result = box.exec(["true"])
        samples[f"{prefix}resume"].append((time.perf_counter() - start) * 1000)
        if result.exit_code != 0:
            raise RuntimeError(f"`true` failed in sandbox {box.id} after standby: {result.stderr.strip()}")
        samples[f"{prefix}restore"] += clock.restores
        if state is not None:
            samples["checkpoint"] += clock.checkpoints
            samples["resident"].append(running)
            samples["throughput"] += [running / MB / (ms / 1000) for ms in clock.checkpoints]
            read_state([box], state)


def live(engine: Engine, plan: Plan, progress: Progress) -> Figures:
    """Live fork 1 -> 4 and 1 -> 16, checkpoint throughput, and standby of a sandbox holding 100 MB (gVisor)."""
    engine.build(SandboxTemplate.model_validate({"metadata": {"name": GVISOR}, "spec": {"runtime": "runsc"}}))
    samples: dict[str, list[float]] = {name: [] for name in (
        "fork4", "fork16", "read", "answered", "restore", "restore_cpu", "other", "checkpoint", "resident",
        "throughput",
        *(f"{who}_{what}" for who in ("held", "idle")
          for what in ("pause", "resume", "restore", "running", "standby", "image")))}
    with RunscClock(engine.runtime("runsc")) as clock:
        for count, rounds in ((4, plan.live_fork4), (16, plan.live_fork16)):
            task = progress.add_task(f"live fork(1 -> {count}), {HELD_MB} MB held", total=rounds)
            for _ in range(rounds):
                live_fork_once(engine, clock, count, samples)
                progress.advance(task)
        task = progress.add_task(f"standby + first command, {HELD_MB} MB held; idle", total=2 * plan.standby)
        box, state = start_holder(engine)
        with box:
            standby_rounds(engine, clock, box, plan.standby, state, samples, "held_")
            progress.advance(task, plan.standby)
        with engine.create(GVISOR) as idle:
            standby_rounds(engine, clock, idle, plan.standby, None, samples, "idle_")
            progress.advance(task, plan.standby)
    running, standby = statistics.median(samples["held_running"]), statistics.median(samples["held_standby"])
    fork4, fork16 = distribution(samples["fork4"]), distribution(samples["fork16"])
    return {
        "live_fork4_ms": fork4,
        "live_fork4_read_ms": distribution(samples["read"]),
        "live_fork4_answered_ms": distribution(samples["answered"]),
        "live_fork4_restore_ms": distribution(samples["restore"]),
        "live_fork4_other_ms": distribution(samples["other"]),
        "live_fork4_restore_cpu_s": round(statistics.mean(samples["restore_cpu"]), 3),
        "live_fork16_ms": fork16,
        "live_fork16_vs_fork4": round(fork16["p50"] / fork4["p50"], 2),
        "live_checkpoint_ms": distribution(samples["checkpoint"]),
        "live_checkpoint_mb_per_s": round(statistics.median(samples["throughput"]), 1),
        "live_resident_mb": round(statistics.median(samples["resident"]) / MB, 1),
        "live_image_mb": round(statistics.median(samples["held_image"]) / MB, 1),
        "live_standby_pause_ms": distribution(samples["held_pause"]),
        "live_resume_first_command_ms": distribution(samples["held_resume"]),
        "live_resume_restore_ms": distribution(samples["held_restore"]),
        "live_resume_idle_ms": distribution(samples["idle_resume"]),
        "live_running_memory_mb": round(running / MB, 1),
        "live_standby_memory_mb": round(standby / MB, 3),
        "live_standby_memory_ratio": round(standby / running, 5),
    }


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
        if shutil.which("runsc"):
            version = subprocess.run(["runsc", "--version"], capture_output=True, text=True).stdout.split()
            figures["machine"]["runsc"] = version[2] if len(version) > 2 else "unknown"
            figures.update(live(engine, plan, progress))
            figures["live_fork4_vs_file_fork4"] = round(
                figures["live_fork4_ms"]["p50"] / figures["fork4_1mb_ms"]["p50"], 1)
        else:
            figures["live_skipped"] = "runsc is not installed"
        figures.update(density(engine, plan, progress))
    figures["machine"]["load_after"] = load()
    return figures


# -- report -----------------------------------------------------------------------------------

def missed(figures: Figures) -> list[str]:
    """The targets not met; one whose figure is missing (its phase did not run) is not met."""
    return [name for name, (_, met) in TARGETS.items() if name not in figures or not met(figures)]


def verdict(name: str, figures: Figures) -> str:
    if name not in TARGETS:
        return ""
    text = TARGETS[name][0]
    return f"[red]{text} MISSED[/]" if name in figures["missed"] else f"[green]{text} ok[/]"


def table(figures: Figures) -> Table:
    m = figures["machine"]
    report = Table(title=f"rollbox engine benchmark ({figures['mode']}, {figures['elapsed_s']} s)",
                   caption=f"{m['cores']} cores, {m['memory_mb']} MB, Linux {m['kernel']}, runc {m['runc']}, "
                           f"runsc {m.get('runsc', 'absent')} (ptrace); "
                           f"load {m['load_before']} before, {m['load_after']} after")
    report.add_column("measurement", no_wrap=True)
    for column in ("p50", "p99", "n"):
        report.add_column(column, justify="right")
    report.add_column("target")
    report.add_column("what")
    for name, value in figures.items():
        if name in ("machine", "mode", "elapsed_s", "missed"):
            continue
        if isinstance(value, dict):
            report.add_row(name, f"{value['p50']:.2f}", f"{value['p99']:.2f}", str(value["n"]), verdict(name, figures),
                           NOTES.get(name, ""))
        else:
            report.add_row(name, f"{value}", "", "", verdict(name, figures), NOTES.get(name, ""))
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
    figures["missed"] = missed(figures)
    Console(width=170).print(table(figures))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
