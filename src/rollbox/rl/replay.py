"""Replays recorded trajectories: same task, same actions, and every observation must match byte for byte.

This is the reproducibility check. A trajectory from a deterministic template (docs/determinism.md) records the
seed its group's sandbox was claimed with and the template's digest: a replay claims a sandbox with that seed, puts
the task's start state in it and forks it as the group was forked, so that the clock, the random streams, the file
times and the process ids are the ones the episode saw. On another template the environment is only as fixed as
the template makes it (hostname, TZ, locale, PYTHONHASHSEED, no network). A difference means something leaked in
(a clock, a random name), the sandbox state was not what the trajectory started from, or the template changed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from rollbox.client import AsyncSandbox
from rollbox.errors import RollboxError
from rollbox.rl.env import AsyncSandboxEnv
from rollbox.rl.episode import CLAIM_GRACE, Episode
from rollbox.rl.prepare import prepare
from rollbox.rl.trajectory import Trajectory

EXCERPT = 40
"""Characters shown on each side of the first differing byte."""


@dataclass(frozen=True)
class Difference:
    """Where a replay first parted from its trajectory."""

    episode_id: str
    step: int
    """0: the first observation (or the template); n: the n-th step."""
    what: str
    """"template", "observation" or "outcome" (reward, terminated, truncated)."""
    offset: int | None = None
    """The first byte (of the UTF-8 text) at which the observations differ."""
    recorded: str = ""
    replayed: str = ""

    def __str__(self) -> str:
        where = f"{self.episode_id} step {self.step}" if self.step else f"{self.episode_id}: the first observation"
        if self.what != "observation":
            return f"{where}: {self.what} {self.replayed} was {self.recorded}"
        return f"{where}: observation differs at byte {self.offset}: {self.replayed!r} was {self.recorded!r}"


def compare(episode_id: str, step: int, recorded: str, replayed: str) -> Difference | None:
    """The first byte at which two observations differ, with some text around it; None when they are equal."""
    old, new = recorded.encode(), replayed.encode()
    if old == new:
        return None
    offset = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    start = max(0, offset - EXCERPT)
    excerpt = [text[start:offset + EXCERPT].decode(errors="replace") for text in (old, new)]
    return Difference(episode_id, step, "observation", offset, *excerpt)


async def replay(trajectory: Trajectory, env: AsyncSandboxEnv, *, first: bool = False) -> list[Difference]:
    """Plays the trajectory's actions on a fresh episode; returns its differences (none when reproduced), or only the
    first one with `first`."""
    differences: list[Difference] = []
    episode, release = await _start(trajectory, env)
    try:
        if trajectory.template_digest and episode.sandbox.info.template_digest != trajectory.template_digest:
            differences.append(Difference(trajectory.episode_id, 0, "template", None, trajectory.template_digest,
                                          str(episode.sandbox.info.template_digest)))
        found = compare(trajectory.episode_id, 0, trajectory.observation, episode.observation)
        differences += [found] if found else []
        for number, step in enumerate(trajectory.steps, 1):
            if first and differences:
                break
            result = await episode.step(step.action)
            found = compare(trajectory.episode_id, number, step.observation, result.observation)
            differences += [found] if found else []
            outcome, recorded = (result.reward, result.terminated, result.truncated), \
                (step.reward, step.terminated, step.truncated)
            if outcome != recorded:
                differences.append(Difference(trajectory.episode_id, number, "outcome", None, str(recorded),
                                              str(outcome)))
    finally:
        for sandbox in release:
            with contextlib.suppress(RollboxError):
                await sandbox.delete()
    return differences[:1] if first else differences


async def first_difference(trajectory: Trajectory, env: AsyncSandboxEnv) -> Difference | None:
    """The first observation (or outcome) of the replay that differs from the trajectory's, byte for byte."""
    found = await replay(trajectory, env, first=True)
    return found[0] if found else None


async def _start(trajectory: Trajectory, env: AsyncSandboxEnv) -> tuple[Episode, list[AsyncSandbox]]:
    """The episode to replay on, and the sandboxes to delete after it. A deterministic trajectory's sandbox is set
    up as its group's was: claimed with the group's seed, given the task's start state, forked as often."""
    if trajectory.sandbox_seed is None:
        await env.reset(options={"task": trajectory.task_id})
        assert env.episode is not None
        return env.episode, []
    task = env.task(trajectory.task_id)
    parent = await env.client.create_sandbox(template=task.template, warmpool=task.warmpool,
                                             seed=trajectory.sandbox_seed,
                                             shutdown_after=env.limits.max_seconds + CLAIM_GRACE)
    sandboxes = [parent]
    try:
        await prepare(parent, task)
        if trajectory.forked:
            sandboxes += await parent.fork(trajectory.forked)
    except BaseException:
        for sandbox in sandboxes:
            with contextlib.suppress(RollboxError):
                await sandbox.delete()
        raise
    return Episode(sandboxes[trajectory.member], task, env.limits), sandboxes
