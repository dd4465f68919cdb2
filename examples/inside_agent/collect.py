"""Collects RL episodes whose agent runs inside its sandbox and reaches the policy through the model gateway.

    .venv/bin/python examples/inside_agent/collect.py                  # as root: an embedded server; about 30 s
    .venv/bin/python examples/inside_agent/collect.py --url URL [--token TOKEN] [--episodes 4] [--out DIR]

It serves the example's policy (`policy.py`, the stand-in for a trainer's vLLM) on loopback, applies the example
template `rl-python`, and runs `--episodes` episodes of every task of `examples/tasks` (8 at once): each claims a
sandbox with `model_gateway=` pointing at the policy, copies `agent.py` in and runs it there (`rollbox.rl.inside`).
The trajectories, with every model call the agent made (request, answer, token ids, log-probabilities), go to
`DIR/trajectories.jsonl`; a table of rewards and calls per task is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from policy import policy_app
from rich.console import Console
from rich.table import Table

from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.rl.inside import InsideAgent, run_inside
from rollbox.rl.tasks import Task, load_tasks
from rollbox.rl.trajectory import Trajectory, TrajectoryLog
from rollbox.server.local import LocalServer
from rollbox.server.threaded import ThreadServer
from rollbox.spec import ModelGateway

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent
AGENT_PATH = "/opt/agent/agent.py"
AT_ONCE = 8


@contextlib.contextmanager
def serving_policy(tasks: list[Task]) -> Iterator[str]:
    """The policy on 127.0.0.1 (a free port), in a thread; yields its base URL."""
    with ThreadServer(policy_app(tasks), tcp=True) as server:
        yield f"{server.url}/v1"


@contextlib.contextmanager
def router(url: str | None, data_dir: Path) -> Iterator[str]:
    if url:
        yield url
        return
    with LocalServer(data_dir) as server:
        yield server.url


async def collect(url: str, token: str | None, tasks: list[Task], episodes: int, upstream: str,
                  out: Path) -> list[Trajectory]:
    agent = InsideAgent(command=["python3", AGENT_PATH], files={AGENT_PATH: (HERE / "agent.py").read_text()},
                        timeout=300)
    gateway = ModelGateway(upstream=upstream, model="policy", max_requests=16)
    room = asyncio.Semaphore(AT_ONCE)

    async def one(client: AsyncSandboxClient, task: Task, member: int) -> Trajectory:
        async with room:
            return await run_inside(client, task, agent, gateway, episode_id=f"inside/{task.id}/0/{member}",
                                    group_id=f"inside/{task.id}/0", seed=member)

    async with AsyncSandboxClient(url, token) as client:
        trajectories = await asyncio.gather(*(one(client, task, member) for task in tasks
                                              for member in range(episodes)))
    with TrajectoryLog(out / "trajectories.jsonl") as log:
        for trajectory in trajectories:
            log.append(trajectory)
    return trajectories


def report(trajectories: list[Trajectory]) -> Table:
    table = Table(title="episodes whose agent ran inside the sandbox")
    for column in ("task", "episodes", "mean reward", "model calls", "tokens", "errors"):
        table.add_column(column)
    for task_id in sorted({t.task_id for t in trajectories}):
        mine = [t for t in trajectories if t.task_id == task_id]
        calls = [call for t in mine for call in t.model_calls]
        tokens = sum((call.prompt_tokens or 0) + (call.completion_tokens or 0) for call in calls)
        table.add_row(task_id, str(len(mine)), f"{sum(t.reward for t in mine) / len(mine):.2f}", str(len(calls)),
                      str(tokens), str(sum(1 for t in mine if t.error)))
    return table


def main(argv: list[str] | None = None) -> list[Trajectory]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a rollbox router (default: start an embedded one; needs root)")
    parser.add_argument("--token")
    parser.add_argument("--tasks", default=str(EXAMPLES / "tasks"), help="a task file or directory")
    parser.add_argument("--episodes", type=int, default=4, help="episodes per task")
    parser.add_argument("--out", default="inside-run", help="where trajectories.jsonl goes")
    args = parser.parse_args(argv)
    tasks = load_tasks(args.tasks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rollbox-inside-") as data_dir, serving_policy(tasks) as upstream, \
            router(args.url, Path(data_dir)) as url:
        with SandboxClient(url, args.token) as client:
            client.apply(str(EXAMPLES / "templates" / "rl-python.yaml"))
        trajectories = asyncio.run(collect(url, args.token, tasks, args.episodes, upstream, out))
    Console().print(report(trajectories))
    print(f"{len(trajectories)} episodes in {time.perf_counter() - started:.1f} s; "
          f"trajectories in {out / 'trajectories.jsonl'}")
    return trajectories


if __name__ == "__main__":
    main()
