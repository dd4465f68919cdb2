"""examples/inside_agent end to end, as a user runs it against a router: its agent runs inside each sandbox and
reaches the example's policy only through the sandbox's model gateway; every model call lands in the trajectory,
and the reward follows the fix the policy chose."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rollbox.rl.trajectory import read_trajectories
from tests.support.servers import EXAMPLES

COLLECT = EXAMPLES / "inside_agent" / "collect.py"


def test_inside_agent_collection(url: str, tmp_path: Path) -> None:
    tasks = EXAMPLES / "tasks" / "ledger.yaml"
    done = subprocess.run([sys.executable, str(COLLECT), "--url", url, "--tasks", str(tasks), "--episodes", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "episodes whose agent ran inside the sandbox" in done.stdout
    trajectories = list(read_trajectories(tmp_path / "trajectories.jsonl"))
    assert len(trajectories) == 2 * 5 and not [t.error for t in trajectories if t.error]
    for trajectory in trajectories:
        first, last = trajectory.model_calls
        assert first.request["model"] == "policy" and first.request["seed"] == trajectory.seed
        assert first.response["choices"][0]["message"]["tool_calls"] and last.response["choices"][0]["message"][
            "content"] == "Done: the fix is in place."
        assert first.token_ids and len(first.logprobs or []) == len(first.token_ids) and first.completion_tokens
        assert "edited" in trajectory.steps[0].observation and trajectory.terminated
        chose_solution = first.response["choices"][0]["message"]["tool_calls"][0]["id"] == "call-0"
        assert trajectory.reward == (1.0 if chose_solution else 0.0), trajectory.task_id
    assert {t.reward for t in trajectories} == {0.0, 1.0}
