"""The engine benchmark still runs end to end and still prints the figures scripts read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "engine.py"
DISTRIBUTIONS = {
    "subprocess_true_ms", "runc_exec_true_ms", "exec_true_ms", "exec_echo_ms", "create_ms", "delete_ms",
    "python_ms", "reset_ms", "pause_ms", "resume_ms", "fork4_1mb_ms", "fork4_200mb_ms",
}
SCALARS = {
    "exec_true_vs_subprocess", "python_per_s", "density_sandboxes", "density_mb_per_sandbox",
    "density_slab_mb_per_sandbox", "density_cgroup_mb_per_sandbox", "density_create_per_s", "density_delete_per_s",
}


@pytest.mark.slow
def test_quick_benchmark_prints_every_figure_as_json() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["mode"] == "quick"
    assert {"cores", "memory_mb", "kernel", "runc", "load_before", "load_after"} <= figures["machine"].keys()
    for name in DISTRIBUTIONS:
        assert set(figures[name]) == {"p50", "p99", "n"}, name
        assert 0 < figures[name]["p50"] <= figures[name]["p99"], name
    for name in SCALARS:
        assert isinstance(figures[name], int | float), name
