"""The main job: GRPO on the example tasks, from sandboxed rewards alone, in a few minutes.

`python -m rollbox.rl.train` (or `train(TrainConfig())`) applies the example template and warm
pool to a router (the embedded one unless `url` is given), then per iteration collects a group of
episodes per task with the candidate policy, prints a row of the table, and takes a GRPO step.
It writes the trajectories (JSONL, plus Parquet when pyarrow is installed), a reward-curve PNG
and summary.json to `out_dir`. `shuffle_rewards` permutes the rewards before every update: the
control run, in which success must not rise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

from rollbox import tracing
from rollbox._console import make_console
from rollbox._signals import exit_on_sigterm
from rollbox.client import AsyncSandboxClient
from rollbox.rl.collect import collect_async
from rollbox.rl.cost import DEFAULT_PRICES, CostSummary, PriceTable, combine, load_prices, micro, summarize
from rollbox.rl.grpo import CandidatePolicy, grpo_update
from rollbox.rl.tasks import Task, load_tasks
from rollbox.rl.trajectory import Trajectory, read_trajectories, write_parquet
from rollbox.server.local import LocalServer

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEFAULT_DATA_DIR = Path("/var/lib/rollbox-rl")
COLUMNS = (("iter", 5), ("episodes", 10), ("success", 9), ("reward", 8), ("P(fix)", 8), ("eps/s", 7),
           ("claim p50", 11), ("exec p50", 10), ("verify p50", 12), ("{unit}/episode", 16), ("{unit}/iter", 14))
"""The table's headers and widths; the last two are the iteration's cost in the price table's `micro_unit`."""


@dataclass
class TrainConfig:
    tasks: Path = EXAMPLES / "tasks"
    template: Path = EXAMPLES / "templates" / "rl-python.yaml"
    iterations: int = 8
    group_size: int = 8
    concurrency: int = 16
    learning_rate: float = 2.0
    seed: int = 0
    shuffle_rewards: bool = False
    out_dir: Path = Path("rl-run")
    resume: bool = False
    """Keep the trajectories already in out_dir and play only the missing episodes."""
    url: str | None = None
    """A running router to use instead of starting the embedded one."""
    token: str | None = None
    data_dir: Path = DEFAULT_DATA_DIR
    """The embedded server's data directory (templates stay cached there between runs)."""
    task_ids: Sequence[str] = field(default_factory=tuple)
    """Train on these tasks only (all when empty)."""
    progress: bool = True
    prices: Path = DEFAULT_PRICES
    """The price table (YAML, rollbox.rl.cost) that turns the episodes' cost into money."""


class IterationStats(BaseModel):
    iteration: int
    episodes: int
    success_rate: float
    """Resolved episodes among those that ran (errored ones are counted in `errors`)."""
    mean_reward: float
    expected_success: float
    """The probability that the policy which played this iteration samples the reference fix."""
    episodes_per_s: float
    claim_p50_ms: float
    exec_p50_ms: float
    verify_p50_ms: float
    errors: int
    wall_s: float
    cost: CostSummary
    """The iteration's episodes' cost, summed, and its price."""
    tasks: dict[str, CostSummary]
    """The same per task."""


class TrainReport(BaseModel):
    iterations: list[IterationStats]
    episodes: int
    wall_s: float
    trajectories: str
    curve: str | None
    prices: PriceTable
    cost: CostSummary
    """Every iteration's cost, summed, and its price on `prices.machine_type`."""
    tasks: dict[str, CostSummary]

    @property
    def rise(self) -> float:
        """How much the success rate grew from the first iteration to the last."""
        return self.iterations[-1].success_rate - self.iterations[0].success_rate


def train(config: TrainConfig, console: Console | None = None) -> TrainReport:
    console = console or make_console()
    if config.url:
        return asyncio.run(_train(config, config.url, console))
    with LocalServer(config.data_dir) as server:
        console.print(f"embedded server at {server.url} (data in {config.data_dir})")
        return asyncio.run(_train(config, server.url, console))


async def _train(config: TrainConfig, url: str, console: Console) -> TrainReport:
    started = time.perf_counter()
    tasks = _tasks(config)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "trajectories.jsonl"
    if not config.resume:
        jsonl.unlink(missing_ok=True)
    prices = load_prices(config.prices)
    policy = CandidatePolicy(tasks)
    shuffler = random.Random(config.seed)
    history: list[IterationStats] = []
    async with AsyncSandboxClient(url, config.token) as client:
        await client.apply(str(config.template))
        console.print(f"applied {config.template.name}; training on {len(tasks)} tasks, "
                      f"{config.group_size} episodes per group, {config.iterations} iterations")
        console.print(_row([header.format(unit=prices.micro_unit) for header, _ in COLUMNS]))
        for iteration in range(config.iterations):
            begun = time.perf_counter()
            batch = await collect_async(policy, tasks, client=client, group_size=config.group_size,
                                        concurrency=config.concurrency, seed=config.seed, tag=f"it{iteration}",
                                        out=jsonl, progress=config.progress)
            wall = time.perf_counter() - begun
            history.append(_stats(iteration, batch, wall, policy.expected_success(), prices))
            rewards = [t.reward for t in batch]
            if config.shuffle_rewards:
                shuffler.shuffle(rewards)
            grpo_update(policy, batch, config.learning_rate, rewards)
            console.print(_row(_cells(history[-1])))
    curve = _plot(history, out / "reward_curve.png", config.shuffle_rewards)
    trajectories = list(read_trajectories(jsonl))
    _write_parquet(trajectories, out / "trajectories.parquet")
    tasks_played = sorted({task for s in history for task in s.tasks})
    report = TrainReport(iterations=history, episodes=sum(s.episodes for s in history),
                         wall_s=time.perf_counter() - started, trajectories=str(jsonl), curve=curve, prices=prices,
                         cost=combine(s.cost for s in history),
                         tasks={task: combine(s.tasks[task] for s in history if task in s.tasks)
                                for task in tasks_played})
    (out / "summary.json").write_text(report.model_dump_json(indent=2))
    console.print(f"{report.episodes} episodes in {report.wall_s:.0f}s; success {history[0].success_rate:.2f} -> "
                  f"{history[-1].success_rate:.2f}; wrote {jsonl}, {curve or 'no curve (matplotlib missing)'}")
    console.print(f"cost on {prices.machine_type}: {micro(report.cost.price)} {prices.micro_unit} "
                  f"({micro(report.cost.price_per_episode)} {prices.micro_unit} per episode; "
                  f"{report.cost.cpu_seconds:.1f} CPU-seconds, {report.cost.memory_gb_seconds:.1f} memory GB-seconds)")
    return report


def _tasks(config: TrainConfig) -> list[Task]:
    tasks = load_tasks(config.tasks)
    if config.task_ids:
        wanted = set(config.task_ids)
        tasks = [task for task in tasks if task.id in wanted]
        if len(tasks) != len(wanted):
            raise ValueError(f"unknown task ids: {sorted(wanted - {task.id for task in tasks})}")
    return tasks


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _per_task(trajectories: list[Trajectory], prices: PriceTable) -> dict[str, CostSummary]:
    tasks = sorted({t.task_id for t in trajectories})
    return {task: summarize((t.cost for t in trajectories if t.task_id == task), prices) for task in tasks}


def _stats(iteration: int, batch: list[Trajectory], wall: float, expected: float,
           prices: PriceTable) -> IterationStats:
    ok = [t for t in batch if t.error is None]
    steps = [step for t in ok for step in t.steps]
    return IterationStats(
        iteration=iteration, episodes=len(batch), success_rate=sum(t.resolved for t in ok) / max(1, len(ok)),
        mean_reward=sum(t.reward for t in ok) / max(1, len(ok)), expected_success=expected,
        episodes_per_s=len(batch) / wall if wall else 0.0,
        claim_p50_ms=_p50([t.claim_ms for t in ok]),
        exec_p50_ms=_p50([s.sandbox_ms for s in steps if isinstance(s.action, dict) and s.action["tool"] == "bash"]),
        verify_p50_ms=_p50([s.sandbox_ms for s in steps if s.terminated]),
        errors=len(batch) - len(ok), wall_s=wall, cost=summarize((t.cost for t in batch), prices),
        tasks=_per_task(batch, prices))


def _cells(stats: IterationStats) -> tuple[str, ...]:
    return (str(stats.iteration), str(stats.episodes), f"{stats.success_rate:.2f}", f"{stats.mean_reward:.2f}",
            f"{stats.expected_success:.2f}", f"{stats.episodes_per_s:.1f}", f"{stats.claim_p50_ms:.1f} ms",
            f"{stats.exec_p50_ms:.1f} ms", f"{stats.verify_p50_ms:.1f} ms", micro(stats.cost.price_per_episode),
            micro(stats.cost.price))


def _row(cells: Sequence[str]) -> str:
    """One line of plain columns, right-aligned: printed as each iteration ends, it cannot wait to size them."""
    return "".join(cell.rjust(width) for cell, (_, width) in zip(cells, COLUMNS, strict=True))


def _plot(history: list[IterationStats], path: Path, shuffled: bool) -> str | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6, 4))
    iterations = [s.iteration for s in history]
    axes.plot(iterations, [s.success_rate for s in history], marker="o", label="success rate (sampled episodes)")
    axes.plot(iterations, [s.mean_reward for s in history], marker=".", linestyle=":", label="mean reward")
    axes.plot(iterations, [s.expected_success for s in history], linestyle="--", label="P(policy samples the fix)")
    axes.set(xlabel="iteration", ylabel="rate", ylim=(0, 1.05),
             title="GRPO on the example tasks" + (" (shuffled rewards)" if shuffled else ""))
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return str(path)


def _write_parquet(trajectories: list[Trajectory], path: Path) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return
    write_parquet(trajectories, path)


def main(argv: Sequence[str] | None = None) -> None:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(prog="python -m rollbox.rl.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=Path, default=defaults.tasks, help="task file or directory (%(default)s)")
    parser.add_argument("--template", type=Path, default=defaults.template, help="template YAML (%(default)s)")
    parser.add_argument("--iterations", type=int, default=defaults.iterations)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--shuffle-rewards", action="store_true", help="the control run: permute rewards")
    parser.add_argument("--out-dir", type=Path, default=defaults.out_dir, help="where results go (%(default)s)")
    parser.add_argument("--resume", action="store_true", help="keep finished episodes of an earlier run")
    parser.add_argument("--url", help="use this router instead of the embedded server")
    parser.add_argument("--token", help="the router's bearer token")
    parser.add_argument("--data-dir", type=Path, default=defaults.data_dir, help="embedded server data (%(default)s)")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--prices", type=Path, default=defaults.prices,
                        help="price table (YAML) for the cost per episode (%(default)s)")
    parser.add_argument("--tracing", choices=tracing.EXPORTERS,
                        help="send OpenTelemetry spans of the episodes and the embedded server's work to the OTLP "
                             "collector of OTEL_EXPORTER_OTLP_ENDPOINT, or print them (docs/observability.md)")
    args = parser.parse_args(argv)
    if args.tracing and not tracing.on:
        os.environ["OTEL_TRACES_EXPORTER"] = args.tracing  # the embedded server, a child process, traces too
        tracing.enable(args.tracing)
    exit_on_sigterm()  # stopped by timeout or kill, the embedded server and its sandboxes still go
    train(TrainConfig(**{key: value for key, value in vars(args).items() if key != "tracing"}))


if __name__ == "__main__":
    main()
