"""The engine benchmark still runs end to end and still prints the figures scripts read."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from rollbox.engine.engine import RUN_ROOT
from tests.support.engines import engine_cgroups, run_dirs

BENCH = Path(__file__).resolve().parents[2] / "bench" / "engine.py"
DISTRIBUTIONS = {
    "subprocess_true_ms", "runc_exec_true_ms", "exec_true_ms", "exec_echo_ms", "exec_true_isolated_ms",
    "create_ms", "delete_ms",
    "python_ms", "reset_ms", "pause_ms", "resume_ms", "fork4_1mb_ms", "fork4_200mb_ms",
}
SCALARS = {
    "exec_true_vs_subprocess", "python_per_s", "density_sandboxes", "density_mb_per_sandbox",
    "density_slab_mb_per_sandbox", "density_cgroup_mb_per_sandbox", "density_create_per_s", "density_delete_per_s",
}


def quick_figures(bench: Path, timeout: float, *options: str) -> dict[str, Any]:
    """Runs `bench --quick` on an embedded server (never one ROLLBOX_URL names): its last line's JSON."""
    embedded = {name: value for name, value in os.environ.items() if name not in ("ROLLBOX_URL", "ROLLBOX_TOKEN")}
    engines_before = engine_cgroups()
    done = subprocess.run([sys.executable, str(bench), "--quick", *options], capture_output=True, text=True,
                          timeout=timeout, env=embedded)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-4000:]
    assert engine_cgroups() <= engines_before, "the benchmark left cgroups of an engine it made"
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["mode"] == "quick"
    return figures


@pytest.mark.slow
def test_quick_benchmark_prints_every_figure_as_json() -> None:
    figures = quick_figures(BENCH, 180)
    assert {"cores", "memory_mb", "kernel", "runc", "load_before", "load_after"} <= figures["machine"].keys()
    for name in DISTRIBUTIONS:
        assert set(figures[name]) == {"p50", "p99", "n"}, name
        assert 0 < figures[name]["p50"] <= figures[name]["p99"], name
    for name in SCALARS:
        assert isinstance(figures[name], int | float), name


@pytest.mark.slow
def test_a_benchmark_stopped_with_sigterm_still_removes_what_it_made() -> None:
    """As `timeout` stops one: its sandboxes (their run directory, /run/rollbox/bench-*) and data directory go."""
    data = os.path.join(tempfile.gettempdir(), "rollbox-bench-*")
    runs_before, data_before = bench_runs(), set(glob.glob(data))
    bench = subprocess.Popen([sys.executable, str(BENCH), "--quick"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(any((RUN_ROOT / run).iterdir()) for run in bench_runs() - runs_before):
            assert bench.poll() is None and time.monotonic() < deadline, "no sandbox started"
            time.sleep(0.05)
        bench.terminate()
        _, stderr = bench.communicate(timeout=120)
    finally:
        bench.kill()
    assert "Traceback" not in stderr, stderr[-2000:]
    assert bench_runs() == runs_before
    assert set(glob.glob(data)) == data_before


def bench_runs() -> set[str]:
    """The benchmarks' engines' run directories (`bench-*` in RUN_ROOT)."""
    return {run for run in run_dirs() if run.startswith("bench-")}


SERVER_BENCH = BENCH.parent / "server.py"
MEASUREMENTS = {f"{phase}_{client}" for client in ("raw", "sdk") for phase in (
    "claim_c1", "claim_c16", "claim_c64", "claim_c64_shared", "claim_turnover", "exec_true", "exec_load",
    "python_reuse", "python_isolated", "burst")}
"""Each phase through both clients: latencies, rate, CPU per operation of the server and the client."""
TRACED = {f"tracing_{phase}_sdk" for phase in ("claim", "exec")}
"""The tracing phase's figures held to a target: tracing on against tracing off."""


@pytest.mark.slow
def test_quick_server_benchmark_prints_every_figure_as_json_and_plots_the_claims(tmp_path: Path) -> None:
    plot = tmp_path / "claims.png"
    figures = quick_figures(SERVER_BENCH, 300, "--plot", str(plot))
    assert plot.read_bytes().startswith(b"\x89PNG") and plot.stat().st_size > 20_000
    assert figures["machine"]["server"] == "embedded, unix"
    assert {"cores", "load_before", "load_after"} <= figures["machine"].keys()
    for name in MEASUREMENTS:
        measured = figures[name]
        assert {"p50", "p99", "n", "per_s", "server_cpu_ms", "client_cpu_ms", "cold"} <= measured.keys(), name
        assert 0 < measured["p50"] <= measured["p99"], name
        assert measured["server_cpu_ms"] > 0 and measured["client_cpu_ms"] > 0, name
    for floor in ("http_floor_c64_raw", "http_floor_unix_c64_raw"):
        assert 0 < figures[floor]["p50"] <= figures[floor]["p99"], floor
    apart = {name for name, value in figures.items() if isinstance(value, dict) and value.get("cpus_apart")}
    assert apart == {"http_floor_c64_raw", "http_floor_unix_c64_raw"} | {
        f"claim_c{c}_{client}" for c in (1, 16, 64) for client in ("raw", "sdk")}
    for client in ("raw", "sdk"):
        assert {"requested", "failed", "wall_s"} <= figures[f"burst_{client}"].keys()
    for name in ("engine_exec_true_ms", "engine_exec_async_true_ms", "engine_create_ms", "engine_delete_ms",
                 "engine_python_ms"):
        assert set(figures[name]) == {"p50", "p99", "n"}, name
    for name in ("engine_python_per_s", "router_exec_overhead_ms", "sdk_exec_overhead_ms"):
        assert isinstance(figures[name], int | float), name
    for name in (f"tracing_{phase}_{side}sdk" for phase in ("claim", "exec") for side in ("", "off_", "sampled_")):
        assert 0 < figures[name]["p50"] <= figures[name]["p99"], name
    assert figures["tracing_span_cpu_us"] > 0 and figures["tracing_claim_floor_ratio"] > 1
    assert set(figures["missed"]) <= MEASUREMENTS | TRACED


def test_cpus_apart_pins_the_client_and_the_server_loop_then_puts_back_what_they_had(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Also a thread the server starts while pinned (it would hand its one CPU down to every sandbox it starts),
    and a server that dies meanwhile."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    monkeypatch.syspath_prepend(str(BENCH.parent))
    from cpu import cpus_apart

    start_thread = ("import sys, threading, time\n"
                    "def run(): print(threading.get_native_id(), flush=True); time.sleep(60)\n"
                    "for line in sys.stdin: threading.Thread(target=run, daemon=True).start()\n")
    server = subprocess.Popen([sys.executable, "-c", start_thread], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert server.stdin is not None and server.stdout is not None
    try:
        server.stdin.write("\n")
        server.stdin.flush()
        before = int(server.stdout.readline())
        with cpus_apart(server.pid):
            assert os.sched_getaffinity(server.pid) == {cpus[0]} and os.sched_getaffinity(0) == {cpus[1]}
            assert os.sched_getaffinity(before) == set(cpus)
            server.stdin.write("\n")
            server.stdin.flush()
            during = int(server.stdout.readline())
            assert os.sched_getaffinity(during) == {cpus[0]}
        for task in (0, server.pid, before, during):
            assert os.sched_getaffinity(task) == set(cpus), task
        with cpus_apart(server.pid):  # a server that dies while pinned leaves this process's CPUs as they were
            server.kill()
            server.wait()
        assert os.sched_getaffinity(0) == set(cpus)
    finally:
        server.kill()
        server.wait()


RL_BENCH = BENCH.parent / "rl.py"


@pytest.mark.slow
def test_quick_rl_benchmark_runs_every_phase_without_a_failed_request() -> None:
    """Episodes, the SandboxFusion gateway (its own client on its server thread's loop) and the main job."""
    figures = quick_figures(RL_BENCH, 600)
    assert figures["episodes"] > 0 and figures["episode_errors"] == 0
    for name in ("run_code", "run_code_fresh"):
        assert figures[f"{name}_ok"] == figures[f"{name}_requests"] > 0, name
        assert figures[f"{name}_per_s"] > 0, name
    assert figures["train_episodes"] > 0 and figures["train_wall_s"] > 0


STORE_BENCH = BENCH.parent / "store.py"


@pytest.mark.slow
def test_quick_store_benchmark_prints_both_stores_as_json() -> None:
    figures = quick_figures(STORE_BENCH, 120)
    for store in ("sqlite", "rollbox"):
        measured = figures[f"commit_{store}"]
        assert {"p50", "p99", "n", "max", "slow_per_min"} <= measured.keys(), store
        assert measured["n"] > 1000 and 0 < measured["p50"] <= measured["p99"] <= measured["max"], store
