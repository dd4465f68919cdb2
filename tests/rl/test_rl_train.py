"""The main job on real sandboxes: success rises with the rewards, and does not with shuffled rewards."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from rollbox.rl.train import TrainConfig, train
from tests.support.engines import run_dirs
from tests.support.servers import example_tasks

TASK_IDS = [task.id for task in example_tasks()][::3]


@pytest.mark.slow
def test_success_rises_because_of_the_rewards(url: str, tmp_path: Path) -> None:
    config = TrainConfig(iterations=4, group_size=6, learning_rate=3.0, task_ids=TASK_IDS, url=url,
                         out_dir=tmp_path / "real", progress=False)
    output = io.StringIO()
    real = train(config, Console(file=output, width=200))
    control = train(replace(config, shuffle_rewards=True, out_dir=tmp_path / "shuffled"), Console(file=io.StringIO()))

    first, last = real.iterations[0], real.iterations[-1]
    assert first.success_rate < 0.5 and last.success_rate >= first.success_rate + 0.3, output.getvalue()
    assert last.expected_success > 0.8
    assert control.rise < 0.25 and control.iterations[-1].expected_success < 0.45
    assert real.episodes == 4 * 6 * len(TASK_IDS)

    table = output.getvalue().splitlines()
    header = next(i for i, line in enumerate(table) if "success" in line and "claim p50" in line)
    assert len([line for line in table[header + 1:] if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])]) == 4
    assert (tmp_path / "real" / "reward_curve.png").read_bytes().startswith(b"\x89PNG")
    assert len((tmp_path / "real" / "trajectories.jsonl").read_text().splitlines()) == real.episodes
    assert json.loads((tmp_path / "real" / "summary.json").read_text())["episodes"] == real.episodes


@pytest.mark.slow
def test_in_a_pipe_the_trainers_lines_stay_whole(tmp_path: Path) -> None:
    """`make train | tee log` or a CI log: no line wraps at 80 columns, and no progress bar litters the table."""
    done = subprocess.run([sys.executable, "-m", "rollbox.rl.train", "--iterations", "1", "--group-size", "2",
                           "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"embedded server at unix:///\S+/router\.sock \(data in .+/data\)", lines[0]), lines[0]
    (header,) = [line.split() for line in lines if "P(fix)" in line]
    assert header[0] == "iter" and header[-2:] == ["µUSD/episode", "µUSD/iter"]
    (row,) = [line.split() for line in lines if line.split()[:1] == ["0"]]
    assert len(row) == len(header), "a cell for every header (`claim p50` and `12.3 ms` are two words each)"
    assert 0 < float(row[-2]) < float(row[-1]), "an episode's price shows in µUSD, and an iteration's is more"
    assert re.fullmatch(r"cost on \S+: [\d.]+ µUSD \([\d.]+ µUSD per episode; .+ memory GB-seconds\)", lines[-1])
    assert "━" not in done.stdout and len(lines) == 6, done.stdout


def test_cli_help() -> None:
    result = subprocess.run([sys.executable, "-m", "rollbox.rl.train", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--shuffle-rewards" in result.stdout


def _engine_id(data_dir: Path) -> str:
    """The id an engine keeps in its state (and names its run directory by), read without opening the engine (which
    would make that directory again). Only its own: other tests' engines come and go meanwhile."""
    (state,) = data_dir.rglob("state.db")
    with contextlib.closing(sqlite3.connect(f"file:{state}?mode=ro", uri=True)) as db:
        return db.execute("SELECT value FROM meta WHERE key='engine_id'").fetchone()[0]


@pytest.mark.slow
def test_the_trainer_stopped_with_sigterm_stops_its_embedded_server(tmp_path: Path) -> None:
    """`timeout` stops `make train` with SIGTERM: the embedded server it started must not live on, sandboxes
    and all."""
    trainer = subprocess.Popen([sys.executable, "-m", "rollbox.rl.train", "--data-dir", str(tmp_path / "data"),
                                "--out-dir", str(tmp_path / "out"), "--no-progress"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not (servers := _servers_of(trainer.pid)):
            assert trainer.poll() is None and time.monotonic() < deadline, "the trainer started no server"
            time.sleep(0.05)
        trainer.terminate()
        _, stderr = trainer.communicate(timeout=120)
        assert "Traceback" not in stderr, stderr[-2000:]
        assert not [pid for pid in servers if os.path.exists(f"/proc/{pid}")], "the embedded server lives on"
        assert _engine_id(tmp_path / "data") not in run_dirs(), "its engine's run directory stayed"
    finally:
        trainer.kill()
        for pid in servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _servers_of(pid: int) -> list[int]:
    """The embedded servers a process started (`rollbox.server` children)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = []
    for child in children:
        with contextlib.suppress(OSError):
            if b"rollbox.server" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
    return found
