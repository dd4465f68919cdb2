"""Reproducibility: recorded trajectories replayed on fresh sandboxes give the same observations, byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollbox.rl.collect import Observation, collect_async
from rollbox.rl.env import AsyncSandboxEnv
from rollbox.rl.replay import replay
from rollbox.rl.trajectory import read_trajectories
from tests.support.servers import example_tasks

pytestmark = pytest.mark.anyio
TASKS = [task for task in example_tasks() if task.id in ("textkit-wrap-exact-width", "ledger-split-remainder")]
PROBES = [
    "hostname; echo $HOSTNAME $TZ $LANG $PYTHONHASHSEED; date +%Z; id; pwd; umask",
    "python3 -c \"print(hash('rollbox'), list({'pear', 'fig', 'apple', 'kiwi'}), __import__('time').tzname)\"",
    "python3 -c \"import socket; socket.create_connection(('10.1.2.3', 80), timeout=2)\" 2>&1 | tail -1",
    "ls -R . | head -20; find . -type f | sort | xargs sha256sum",
    "python3 -c \"import random; print(random.Random(7).random())\"; cat /etc/resolv.conf /etc/hosts",
]


async def probing_policy(observation: Observation) -> Any:
    """Looks at everything that could differ between runs, tries the fix on half the seeds, then submits."""
    edits = [{"tool": "str_replace", "path": e.path, "old": e.old, "new": e.new}
             for e in observation.task.solution] if observation.seed % 2 else []  # type: ignore[union-attr]
    script = [{"tool": "bash", "command": probe} for probe in PROBES] + edits + [{"tool": "read_file", "path": "x"},
                                                                               {"tool": "submit"}]
    return script[observation.step]


async def test_replayed_trajectories_match_byte_for_byte(url: str, tmp_path: Path) -> None:
    out = tmp_path / "trajectories.jsonl"
    await collect_async(probing_policy, TASKS, url=url, group_size=4, concurrency=8, seed=3, out=out, progress=False)
    recorded = list(read_trajectories(out))
    assert len(recorded) == 8 and {t.reward for t in recorded} == {0.0, 1.0}
    assert "Network is unreachable" in recorded[0].steps[2].observation
    assert recorded[0].steps[0].observation.startswith("[exit code 0]\nsandbox\nsandbox UTC C.UTF-8 0\nUTC\n")
    async with AsyncSandboxEnv(TASKS, url=url) as env:
        for trajectory in recorded:
            assert await replay(trajectory, env) == []
        tampered = recorded[0].model_copy(deep=True)
        tampered.steps[1].observation += " "
        assert len(await replay(tampered, env)) == 1
