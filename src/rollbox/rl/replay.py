"""Replays recorded trajectories: same task, same actions, and every observation must match byte for byte.

This is the reproducibility check: the template fixes the environment (hostname, TZ, locale,
PYTHONHASHSEED, no network), so a difference means something leaked in (a clock, a random name)
or the sandbox state was not what the trajectory started from.
"""

from __future__ import annotations

from rollbox.rl.env import AsyncSandboxEnv
from rollbox.rl.trajectory import Trajectory


async def replay(trajectory: Trajectory, env: AsyncSandboxEnv) -> list[str]:
    """Plays the trajectory's actions on a fresh episode; returns its differences (none when reproduced)."""
    differences = []
    observation, _ = await env.reset(seed=trajectory.seed, options={"task": trajectory.task_id})
    if observation != trajectory.observation:
        differences.append(f"{trajectory.episode_id}: the first observation differs")
    for number, step in enumerate(trajectory.steps, 1):
        observation, reward, terminated, truncated, _ = await env.step(step.action)
        if observation != step.observation:
            differences.append(f"{trajectory.episode_id} step {number}: observation {observation!r} "
                               f"was {step.observation!r}")
        outcome, recorded = (reward, terminated, truncated), (step.reward, step.terminated, step.truncated)
        if outcome != recorded:
            differences.append(f"{trajectory.episode_id} step {number}: (reward, terminated, truncated) "
                               f"{outcome} was {recorded}")
    return differences
