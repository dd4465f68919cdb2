"""Rollout collection on real sandboxes: forked groups, the JSONL schema, resuming after a crash, Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollbox.client import AsyncSandboxClient
from rollbox.rl.collect import Observation, collect_async
from rollbox.rl.trajectory import Trajectory, TrajectoryLog, read_trajectories, write_parquet
from tests.support.servers import example_tasks

pytestmark = pytest.mark.anyio
TASKS = [task for task in example_tasks() if task.id in ("ledger-format-cents", "intervals-merge-unsorted")]


class Scripted:
    """Marks the file it finds, then submits the reference fix on even members and nothing on odd ones."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at = crash_at
        self.episodes: list[str] = []

    async def __call__(self, observation: Observation) -> Any:
        if observation.step == 0:
            self.episodes.append(observation.episode_id)
            if len(self.episodes) == self.crash_at:
                raise RuntimeError("the policy crashed")
            return {"tool": "bash", "command": "cat MARK 2>/dev/null || echo clean; echo touched > MARK"}
        solution = observation.task.solution
        fixes = list(solution) if int(observation.episode_id.rsplit("/", 1)[1]) % 2 == 0 else []  # type: ignore[arg-type]
        script = [{"tool": "str_replace", "path": e.path, "old": e.old, "new": e.new} for e in fixes]
        script.append({"tool": "submit"})
        observation.metadata["fixed"] = bool(fixes)
        return script[observation.step - 1]


async def test_groups_fork_one_state_and_record_everything(url: str, tmp_path: Path) -> None:
    out = tmp_path / "trajectories.jsonl"
    trajectories = await collect_async(Scripted(), TASKS, url=url, group_size=3, groups=2, concurrency=4, tag="t",
                                       out=out, progress=False)
    assert [t.episode_id for t in trajectories] == [f"t/{task.id}/{g}/{m}" for task in TASKS
                                                     for g in range(2) for m in range(3)]
    assert [t.reward for t in trajectories] == [1.0, 0.0, 1.0] * 4
    for trajectory in trajectories:
        assert trajectory.error is None and trajectory.terminated and not trajectory.truncated
        assert trajectory.group_id == f"t/{trajectory.task_id}/{trajectory.episode_id.split('/')[2]}"
        assert trajectory.steps[0].observation == "[exit code 0]\nclean", "a group member saw another's writes"
        assert trajectory.metadata == {"fixed": trajectory.reward == 1.0}
        assert trajectory.claim_ms > 0 and trajectory.setup_ms > 0 and trajectory.wall_s > 0
        assert trajectory.cpu_seconds and trajectory.cpu_seconds > 0, "each episode records its CPU cost"
        assert trajectory.memory_peak_bytes and trajectory.memory_peak_bytes > 0
        assert all(step.sandbox_ms > 0 and step.policy_ms >= 0 for step in trajectory.steps)
        assert trajectory.verdict is not None and trajectory.resolved == (trajectory.reward == 1.0)
    assert len({t.seed for t in trajectories}) == len(trajectories)
    lines = out.read_text().splitlines()
    assert len(lines) == len(trajectories)
    record = json.loads(lines[0])
    assert record["schema_version"] == 1
    assert set(record) >= {"episode_id", "task_id", "group_id", "seed", "observation", "steps", "reward", "resolved",
                           "terminated", "truncated", "wall_s", "claim_ms", "cpu_seconds", "memory_peak_bytes"}
    assert set(record["steps"][0]) == {"action", "observation", "reward", "terminated", "truncated", "error",
                                       "exit_code", "policy_ms", "sandbox_ms"}
    assert record["steps"][0]["exit_code"] == 0 and record["steps"][-1]["exit_code"] is None, "bash's, and none else"


async def test_a_crashed_collection_resumes_without_redoing_episodes(url: str, tmp_path: Path) -> None:
    out = tmp_path / "trajectories.jsonl"
    crashing = Scripted(crash_at=4)
    with pytest.raises(RuntimeError, match="the policy crashed"):
        await collect_async(crashing, TASKS, url=url, group_size=3, concurrency=1, out=out, progress=False)
    finished = [t.episode_id for t in read_trajectories(out)]
    assert len(finished) == 3
    with out.open("a") as handle:
        handle.write('{"episode_id": "cut short by the cra')
    resumed = Scripted()
    trajectories = await collect_async(resumed, TASKS, url=url, group_size=3, concurrency=1, out=out, progress=False)
    assert sorted(resumed.episodes) == sorted(set(t.episode_id for t in trajectories) - set(finished))
    assert len(trajectories) == 6 and len({t.episode_id for t in trajectories}) == 6
    assert [t.episode_id for t in read_trajectories(out)] == finished + resumed.episodes


def test_log_and_parquet(tmp_path: Path) -> None:
    trajectories = [Trajectory(episode_id=f"e{n}", task_id="t", group_id="g", seed=n, observation="o", reward=n % 2)
                    for n in range(3)]
    with TrajectoryLog(tmp_path / "log.jsonl") as log:
        for trajectory in trajectories:
            log.append(trajectory)
    assert list(read_trajectories(tmp_path / "log.jsonl")) == trajectories
    pyarrow = pytest.importorskip("pyarrow.parquet")
    write_parquet(trajectories, tmp_path / "log.parquet")
    table = pyarrow.read_table(tmp_path / "log.parquet")
    assert table.column("reward").to_pylist() == [0.0, 1.0, 0.0]
    assert json.loads(table.column("steps").to_pylist()[0]) == []


LIVE_TEMPLATE = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: rl-python-live}
spec:
  base: host
  runtime: runsc
  env: {PYTHONHASHSEED: "0", PYTHONDONTWRITEBYTECODE: "1"}
  steps: [{workdir: /work}]
"""


async def test_a_gvisor_groups_members_carry_the_processes_its_setup_started(url: str) -> None:
    """Under gVisor a group's fork is a live fork: a process the task's setup left running is in every member, and
    the rewards are what they are under runc."""
    async with AsyncSandboxClient(url) as client:
        await client.apply(LIVE_TEMPLATE)
    [task] = [task.model_copy(update={"template": "rl-python-live", "warmpool": None,
                                      "setup": [*task.setup, "nohup sleep 1000 >/dev/null 2>&1 &"]})
              for task in TASKS[:1]]

    scripted = Scripted()

    async def policy(observation: Observation) -> Any:
        if observation.step == 0:
            return {"tool": "bash", "command": "pgrep -x sleep >/dev/null && echo alive || echo gone"}
        return await scripted(observation)

    trajectories = await collect_async(policy, [task], url=url, group_size=3, groups=1, concurrency=3, tag="live",
                                       progress=False)
    assert [t.steps[0].observation for t in trajectories] == ["[exit code 0]\nalive"] * 3
    assert [t.reward for t in trajectories] == [1.0, 0.0, 1.0]
