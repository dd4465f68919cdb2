"""A softmax policy over each task's candidate fixes, trained with GRPO from sandbox rewards alone.

The policy knows nothing about which candidate is right: per task it holds one logit per
candidate (the reference fix, the task's wrong candidates, and "change nothing"), samples one
per episode from the episode's seed, and plays it as tool calls. GRPO compares the rewards within
each group (same task, same forked start state) and moves probability toward the candidates that
did better than their group's mean.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from rollbox.rl.actions import Bash, ReadFile, StrReplace, Submit
from rollbox.rl.collect import Observation
from rollbox.rl.tasks import Edit, Task
from rollbox.rl.trajectory import Trajectory


def candidate_fixes(task: Task) -> list[tuple[Edit, ...]]:
    """The reference fix, the task's other candidates, and the empty fix (submit unchanged)."""
    if not isinstance(task.solution, tuple) or not task.solution:
        raise ValueError(f"task {task.id}: the candidate policy needs a solution given as edits")
    return [task.solution, *task.candidates, ()]


def play(task: Task, fix: tuple[Edit, ...]) -> list[Any]:
    """The episode's tool calls: locate the code, read the file, apply the fix, submit."""
    anchor = (fix or task.solution)[0]  # type: ignore[index]
    first_line = (anchor.old.strip().splitlines() or [""])[0]
    return [Bash(command=f"grep -n -F -- {_quote(first_line)} {_quote(anchor.path)} || true"),
            ReadFile(path=anchor.path),
            *(StrReplace(path=edit.path, old=edit.old, new=edit.new) for edit in fix), Submit()]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class CandidatePolicy:
    """`await policy(observation)` plays the candidate it samples for the episode, one tool call per step."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self.fixes = {task.id: candidate_fixes(task) for task in tasks}
        self.logits = {task_id: [0.0] * len(fixes) for task_id, fixes in self.fixes.items()}

    def probabilities(self, task_id: str) -> list[float]:
        logits = self.logits[task_id]
        top = max(logits)
        weights = [math.exp(value - top) for value in logits]
        total = sum(weights)
        return [weight / total for weight in weights]

    def expected_success(self) -> float:
        """The probability of sampling the reference fix, averaged over tasks (index 0 of every task)."""
        return sum(self.probabilities(task_id)[0] for task_id in self.logits) / len(self.logits)

    async def __call__(self, observation: Observation) -> Any:
        task = observation.task
        if "candidate" not in observation.metadata:
            rng = random.Random(observation.seed)
            observation.metadata["candidate"] = rng.choices(range(len(self.fixes[task.id])),
                                                            self.probabilities(task.id))[0]
        script = play(task, self.fixes[task.id][observation.metadata["candidate"]])
        return script[min(observation.step, len(script) - 1)]


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """GRPO's advantage: each reward relative to its group, scaled by the group's spread (0 when all equal)."""
    mean = sum(rewards) / len(rewards)
    spread = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if spread < 1e-9:
        return [0.0] * len(rewards)
    return [(r - mean) / spread for r in rewards]


def grpo_update(policy: CandidatePolicy, trajectories: Sequence[Trajectory], learning_rate: float,
                rewards: Sequence[float] | None = None) -> None:
    """One policy-gradient step: per group, grad log pi(choice) weighted by the group-relative advantage.

    `rewards` replaces the trajectories' own rewards (the shuffled-reward control uses it). Episodes
    that failed for reasons of their own (sandbox or setup errors) carry no signal and are left out.
    """
    rewards = [t.reward for t in trajectories] if rewards is None else list(rewards)
    groups: dict[str, list[tuple[Trajectory, float]]] = defaultdict(list)
    for trajectory, reward in zip(trajectories, rewards, strict=True):
        if trajectory.error is None:
            groups[trajectory.group_id].append((trajectory, reward))
    gradients: dict[str, list[float]] = {}
    for members in groups.values():
        task_id = members[0][0].task_id
        probabilities = policy.probabilities(task_id)
        gradient = gradients.setdefault(task_id, [0.0] * len(probabilities))
        for (trajectory, _), advantage in zip(members, group_advantages([r for _, r in members]), strict=True):
            choice = trajectory.metadata["candidate"]
            for index, probability in enumerate(probabilities):
                gradient[index] += advantage * ((index == choice) - probability) / len(members)
    for task_id, gradient in gradients.items():
        policy.logits[task_id] = [v + learning_rate * g for v, g in zip(policy.logits[task_id], gradient, strict=True)]
