"""Trajectories: one episode per JSONL line (schema in docs/tasks.md), appended as episodes finish.

Appending line by line is what makes collection resumable: a crash loses at most the line being
written, which `TrajectoryLog` cuts off when it reopens the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rollbox.errors import InvalidRequest
from rollbox.models import ClaimCost, ModelCall

SCHEMA_VERSION = 1


class StepRecord(BaseModel):
    action: Any
    """The canonical tool call (see rl/actions.py), or what the policy returned when it was not one."""
    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    """The error code when the action failed (invalid_action, file_not_found, edit_failed, ...)."""
    exit_code: int | None = None
    """A bash action's exit code; None for the other tools and for a command that timed out."""
    policy_ms: float = 0.0
    sandbox_ms: float = 0.0


class Trajectory(BaseModel):
    schema_version: int = SCHEMA_VERSION
    episode_id: str
    """`<tag>/<task id>/<group>/<member>`: unique within a file, the key for resuming."""
    task_id: str
    group_id: str
    """Episodes of one group started from the same forked sandbox state."""
    seed: int
    sandbox_seed: int | None = None
    """The seed the group's sandbox was claimed with, on a deterministic template (docs/determinism.md); a member
    forked from it ran on a seed its index gives. None when the sandbox was not deterministic."""
    template_digest: str | None = None
    """The template the sandbox started from (its layers, settings and deterministic machine)."""
    member: int = 0
    """The episode's place in its group: 0 ran on the claimed sandbox, m on the (m-1)th child of its fork."""
    forked: int = 0
    """How many children the group's sandbox was forked into (a replay forks as many)."""
    observation: str
    """The first observation (the task's problem statement and instructions)."""
    steps: list[StepRecord] = Field(default_factory=list)
    reward: float = 0.0
    resolved: bool = False
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    """Set when the episode could not run (setup or sandbox failure); its reward is then 0."""
    verdict: dict[str, Any] | None = None
    started_at: float = 0.0
    wall_s: float = 0.0
    claim_ms: float = 0.0
    """Claiming the group's warm sandbox; this and the next two are shared by the group's episodes."""
    setup_ms: float = 0.0
    """Putting the task's start state into it."""
    fork_ms: float = 0.0
    """Forking it into the group's members."""
    cpu_seconds: float | None = None
    memory_peak_bytes: int | None = None
    cost: ClaimCost | None = None
    """What the episode's claim used, from the claim to the last command: CPU-seconds, memory and disk GB-seconds,
    wall time (docs/observability.md). The group's first member's claim also carries the group's setup and fork."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Whatever the policy recorded about the episode (e.g. the candidate it chose)."""
    model_calls: list[ModelCall] = Field(default_factory=list)
    """For an agent that ran inside the sandbox: every call it made to the policy through the sandbox's model
    gateway, with the answers, token ids and log-probabilities (rl/inside.py, docs/gateway.md)."""

    @property
    def policy_ms(self) -> float:
        return sum(step.policy_ms for step in self.steps)

    @property
    def sandbox_ms(self) -> float:
        return sum(step.sandbox_ms for step in self.steps)


class TrajectoryLog:
    """An append-only JSONL file of trajectories, safe to reopen after a crash."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._cut_partial_line()
        self._file = self.path.open("a", encoding="utf-8")

    def _cut_partial_line(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with self.path.open("r+b") as handle:
                handle.truncate(end)

    def append(self, trajectory: Trajectory) -> None:
        """Writes the line through to the OS: a crash of this process loses nothing already appended."""
        self._file.write(trajectory.model_dump_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TrajectoryLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """Every complete line of a JSONL file (a line cut short by a crash is skipped)."""
    path = Path(path)
    if not path.exists():
        return
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.endswith("\n") and line.strip():
                yield Trajectory.model_validate_json(line)


def write_parquet(trajectories: Iterable[Trajectory], path: str | Path) -> None:
    """One row per episode; `steps`, `verdict` and `metadata` become JSON text columns. Needs pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidRequest("writing Parquet needs pyarrow: pip install 'rollbox[rl]'") from None
    rows = []
    for trajectory in trajectories:
        row = trajectory.model_dump()
        for key in ("steps", "verdict", "metadata"):
            row[key] = json.dumps(row[key])
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), str(path))
