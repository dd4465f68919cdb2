"""Episodes whose agent runs inside the sandbox (mini-swe-agent, an installed CLI agent, a script of yours) and
calls the policy itself, through the sandbox's model gateway (docs/gateway.md).

The trainer never sees the agent's steps; it sees what the policy was asked and answered, which is what it trains
on. So an episode here is: claim a sandbox with `model_gateway=` pointing at the trainer's inference server, put
the task's start state in it, copy the agent's files in, run the agent's command until it exits (or its time
is up), run the hidden tests, and read the gateway's record of every model call into the trajectory
(`Trajectory.model_calls`: requests, answers, token ids and log-probabilities when the server returns them).

    agent = InsideAgent(command=["python3", "/opt/agent/agent.py"], files={"/opt/agent/agent.py": source})
    trajectory = await run_inside(client, task, agent, ModelGateway(upstream="http://vllm:8000/v1"),
                                  episode_id="run/task/0/0")
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from rollbox.client import AsyncSandboxClient
from rollbox.errors import RollboxError
from rollbox.models import ExecResult
from rollbox.rl.episode import CLAIM_GRACE, intro, truncate
from rollbox.rl.prepare import prepare
from rollbox.rl.tasks import Task
from rollbox.rl.trajectory import StepRecord, Trajectory
from rollbox.rl.verify import verify
from rollbox.spec import ModelGateway

OUTPUT_KEPT = 20_000
"""Characters of the agent's own output kept in the trajectory (its last ones)."""


@dataclass(frozen=True)
class InsideAgent:
    """What runs in the sandbox: a command, the files it needs, and how long it may take."""

    command: list[str]
    files: dict[str, bytes | str] = field(default_factory=dict)
    """Copied into the sandbox (absolute paths) before the command runs."""
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 600.0
    """Seconds the agent may run; the episode is truncated past them."""


async def run_inside(client: AsyncSandboxClient, task: Task, agent: InsideAgent, gateway: ModelGateway, *,
                     episode_id: str, group_id: str = "", seed: int = 0) -> Trajectory:
    """One episode of `task` by `agent`, its policy reached through `gateway`; the sandbox is deleted after."""
    started = time.time()
    trajectory = Trajectory(episode_id=episode_id, task_id=task.id, group_id=group_id or episode_id, seed=seed,
                            observation=intro(task), started_at=started)
    sandbox = await client.create_sandbox(template=task.template, warmpool=task.warmpool, model_gateway=gateway,
                                          shutdown_after=agent.timeout + CLAIM_GRACE)
    try:
        trajectory.claim_ms = (time.time() - started) * 1000
        await prepare(sandbox, task)
        for path, data in agent.files.items():
            await sandbox.files.write(path, data)
        trajectory.setup_ms = (time.time() - started) * 1000 - trajectory.claim_ms
        ran = time.perf_counter()
        result = await sandbox.commands.run(agent.command, cwd=task.workdir, timeout=agent.timeout,
                                            env={"TASK": task.problem_statement, "SEED": str(seed), **agent.env})
        trajectory.steps.append(_step(agent, result, (time.perf_counter() - ran) * 1000))
        trajectory.truncated = result.timed_out
        trajectory.model_calls = (await sandbox.model_calls()).calls
        verdict = await verify(sandbox, task)
        trajectory.reward, trajectory.resolved, trajectory.verdict = verdict.reward, verdict.resolved, \
            verdict.model_dump()
        trajectory.terminated = not result.timed_out
    except RollboxError as error:
        trajectory.error = f"{error.code}: {error}"
    finally:
        with contextlib.suppress(RollboxError):
            await sandbox.delete()
    trajectory.wall_s = time.time() - started
    return trajectory


def _step(agent: InsideAgent, result: ExecResult, ms: float) -> StepRecord:
    """The agent's whole run as the trajectory's one step: its command, output and exit."""
    output = truncate(result.stdout + result.stderr, OUTPUT_KEPT)
    return StepRecord(action={"tool": "agent", "command": agent.command, "exit_code": result.exit_code},
                      observation=output, truncated=result.timed_out, sandbox_ms=ms)
