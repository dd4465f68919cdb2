"""Rollout collection: a policy plays every task in GRPO groups, on sandboxes forked from one state.

A policy is any async callable from an `Observation` to an action (see rl/actions.py), so an LLM
client plugs in. Per group, one warm sandbox is claimed, the task's start state is put in it, and
it is forked into the group's other members: their episodes start from identical files at the
cost of one setup. Finished episodes are appended to a JSONL file as they end; rerunning the same
call skips every episode the file already holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollbox import tracing
from rollbox._console import make_console
from rollbox.client import AsyncSandbox, AsyncSandboxClient
from rollbox.errors import InvalidRequest, RollboxError
from rollbox.rl.episode import CLAIM_GRACE, Episode, EpisodeLimits
from rollbox.rl.prefetch import Prefetch
from rollbox.rl.prepare import prepare
from rollbox.rl.tasks import Task
from rollbox.rl.trajectory import StepRecord, Trajectory, TrajectoryLog, read_trajectories


@dataclass(frozen=True)
class Turn:
    action: Any
    observation: str


@dataclass(frozen=True)
class Observation:
    """What a policy sees: the latest observation text, and the episode so far for stateless policies."""

    text: str
    task: Task
    episode_id: str
    step: int
    seed: int
    """The episode's seed: a policy that samples should draw from it, so replays take the same actions."""
    turns: tuple[Turn, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    """Shared by every observation of the episode; what the policy puts here is saved in the trajectory."""


Policy = Callable[[Observation], Awaitable[Any]]


def episode_id(tag: str, task: Task, group: int, member: int) -> str:
    return f"{tag}/{task.id}/{group}/{member}"


def episode_seed(seed: int, episode: str) -> int:
    """A stable per-episode seed, the same across runs and machines."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{episode}".encode()).digest()[:4], "big")


def group_seed(seed: int, group: str) -> int:
    """The seed a group's deterministic sandbox is claimed with: stable, and each group's own."""
    return int.from_bytes(hashlib.sha256(f"{seed}:sandbox:{group}".encode()).digest()[:7], "big")


@dataclass
class _Group:
    task: Task
    index: int
    members: list[int]
    index_in_plan: int = 0

    @property
    def id(self) -> str:
        return f"{self.task.id}/{self.index}"


class _Collector:
    def __init__(self, policy: Policy, client: AsyncSandboxClient, *, group_size: int, concurrency: int, seed: int,
                 tag: str, limits: EpisodeLimits, log: TrajectoryLog | None, progress: Progress,
                 plan: Sequence[_Group] = ()) -> None:
        self.policy = policy
        self.client = client
        self.seed = seed
        self._templates: dict[str, bool] = {}
        self.tag = tag
        self.limits = limits
        self.log = log
        self.progress = progress
        self.bar = progress.add_task("collecting", total=0, reward="")
        self.episodes = asyncio.Semaphore(concurrency)
        at_once = max(1, -(-concurrency // group_size)) + 1
        self.groups = asyncio.Semaphore(at_once)
        """Groups set up at once: enough to keep `concurrency` episodes busy while the next group forks."""
        self.ahead = Prefetch(client, [group.task.image for group in plan], at_once)
        self.finished: list[Trajectory] = []

    async def run_group(self, group: _Group) -> None:
        with tracing.span("rollbox.rl.group", {"rollbox.rl.group": f"{self.tag}/{group.id}",
                                               "rollbox.rl.task": group.task.id}):
            await self._run_group(group)

    async def _run_group(self, group: _Group) -> None:
        async with self.groups:
            self.ahead.started(group.index_in_plan)
            try:
                children, timings = await self._fork(group)
            except RollboxError as error:
                for member in group.members:
                    self._finish(self._trajectory(group, member, error=f"group setup failed: {error}"))
                return
            await _all(self.run_episode(group, member, child, timings)
                       for member, child in zip(group.members, children, strict=True))

    async def _fork(self, group: _Group) -> tuple[list[AsyncSandbox], dict[str, Any]]:
        """Claims a warm sandbox, puts the task's start state in it and forks it: the sandbox and its forks
        (which the engine restarts over one frozen copy of its files) are the group's members."""
        started = time.perf_counter()
        seed = group_seed(self.seed, f"{self.tag}/{group.id}") if await self._deterministic(group.task) else None
        parent = await self.client.create_sandbox(**group.task.start,  # type: ignore[arg-type]
                                                  shutdown_after=self.limits.max_seconds + CLAIM_GRACE, seed=seed)
        claimed = time.perf_counter()
        try:
            await prepare(parent, group.task)
            prepared = time.perf_counter()
            children = await parent.fork(len(group.members) - 1) if len(group.members) > 1 else []
        except BaseException:
            with contextlib.suppress(RollboxError):
                await parent.delete()
            raise
        timings = {"claim_ms": (claimed - started) * 1000, "setup_ms": (prepared - claimed) * 1000,
                   "fork_ms": (time.perf_counter() - prepared) * 1000, "sandbox_seed": parent.info.seed}
        return [parent, *children], timings

    async def _deterministic(self, task: Task) -> bool:
        """Whether the task's template runs deterministic sandboxes: a group's claim then gives its seed."""
        if task.template is None:
            return False
        if task.template not in self._templates:
            try:
                spec = (await self.client.get_template(task.template)).spec
            except RollboxError:
                spec = {}
            self._templates[task.template] = bool(spec.get("deterministic"))
        return self._templates[task.template]

    def _trajectory(self, group: _Group, member: int, **fields: Any) -> Trajectory:
        identifier = episode_id(self.tag, group.task, group.index, member)
        fields.setdefault("observation", "")
        return Trajectory(episode_id=identifier, task_id=group.task.id, group_id=f"{self.tag}/{group.id}",
                          seed=episode_seed(self.seed, identifier), member=member, started_at=time.time(), **fields)

    async def run_episode(self, group: _Group, member: int, sandbox: AsyncSandbox, timings: dict[str, Any]) -> None:
        async with self.episodes:
            started = time.perf_counter()
            episode = Episode(sandbox, group.task, self.limits)
            trajectory = self._trajectory(group, member, observation=episode.observation,
                                          forked=len(group.members) - 1, template_digest=sandbox.info.template_digest,
                                          **timings)
            observation = Observation(episode.observation, group.task, trajectory.episode_id, 0, trajectory.seed,
                                      metadata=trajectory.metadata)
            with tracing.span("rollbox.rl.episode", {"rollbox.rl.episode": trajectory.episode_id,
                                                     "rollbox.rl.task": group.task.id,
                                                     "rollbox.sandbox.id": sandbox.id}):
                try:
                    await self._play(episode, observation, trajectory)
                except RollboxError as error:
                    trajectory.error = f"sandbox failed: {error}"
                finally:
                    await _record_cost(sandbox, trajectory)
                    with contextlib.suppress(RollboxError):
                        await sandbox.delete()
            trajectory.wall_s = time.perf_counter() - started
            self._finish(trajectory)

    async def _play(self, episode: Episode, observation: Observation, trajectory: Trajectory) -> None:
        while not episode.done:
            before = time.perf_counter()
            action = await self.policy(observation)
            policy_ms = (time.perf_counter() - before) * 1000
            result = await episode.step(action)
            trajectory.steps.append(StepRecord(
                action=result.action, observation=result.observation, reward=result.reward,
                terminated=result.terminated, truncated=result.truncated, error=result.info.get("error"),
                exit_code=result.info.get("exit_code"), policy_ms=policy_ms, sandbox_ms=result.info["sandbox_ms"]))
            observation = Observation(result.observation, observation.task, observation.episode_id,
                                      observation.step + 1, observation.seed,
                                      (*observation.turns, Turn(result.action, result.observation)),
                                      observation.metadata)
        trajectory.reward = trajectory.steps[-1].reward
        trajectory.terminated, trajectory.truncated = trajectory.steps[-1].terminated, trajectory.steps[-1].truncated
        if episode.verdict is not None:
            trajectory.resolved = episode.verdict.resolved
            trajectory.verdict = episode.verdict.model_dump()

    def _finish(self, trajectory: Trajectory) -> None:
        if self.log is not None:
            self.log.append(trajectory)
        self.finished.append(trajectory)
        rewards = [t.reward for t in self.finished]
        self.progress.update(self.bar, advance=1, reward=f"mean reward {sum(rewards) / len(rewards):.2f}")


async def _all(coroutines: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Runs them concurrently; when one fails, the others are cancelled (and delete their sandboxes)."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _record_cost(sandbox: AsyncSandbox, trajectory: Trajectory) -> None:
    """The claim's cost (docs/observability.md), read after the episode's last command and before its sandbox goes;
    left empty if the sandbox is gone already."""
    try:
        stats = await sandbox.stats()
    except RollboxError:
        return
    trajectory.cpu_seconds, trajectory.memory_peak_bytes = stats.cpu_seconds, stats.memory_peak_bytes
    trajectory.cost = stats.cost


async def collect_async(policy: Policy, tasks: Sequence[Task], *, client: AsyncSandboxClient | None = None,
                        url: str | None = None, token: str | None = None, group_size: int = 8, groups: int = 1,
                        concurrency: int = 16, seed: int = 0, tag: str = "", limits: EpisodeLimits | None = None,
                        out: str | Path | None = None, progress: bool = True) -> list[Trajectory]:
    """Plays `groups` groups of `group_size` episodes per task; returns every episode in task order.

    With `out`, episodes are appended to that JSONL file as they end, and the ones it already holds
    (without an error) are returned from it instead of being played again.
    """
    if group_size < 1 or groups < 1 or concurrency < 1:
        raise InvalidRequest("group_size, groups and concurrency must be at least 1")
    done = {t.episode_id: t for t in read_trajectories(out) if t.error is None} if out else {}
    plan = [_Group(task, index, [m for m in range(group_size) if episode_id(tag, task, index, m) not in done])
            for task in tasks for index in range(groups)]
    owned = client is None
    client = client or AsyncSandboxClient(url, token)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[reward]}"))
    try:
        with contextlib.ExitStack() as stack:
            log = stack.enter_context(TrajectoryLog(out)) if out else None
            shown = make_console()  # a bar redraws itself on a terminal only: elsewhere it would be a stray line
            bar = stack.enter_context(Progress(*columns, console=shown, disable=not (progress and shown.is_terminal)))
            playing = [group for group in plan if group.members]
            for number, group in enumerate(playing):
                group.index_in_plan = number
            collector = _Collector(policy, client, group_size=group_size, concurrency=concurrency, seed=seed,
                                   tag=tag, limits=limits or EpisodeLimits(), log=log, progress=bar, plan=playing)
            bar.update(collector.bar, total=sum(len(group.members) for group in plan))
            await _all(collector.run_group(group) for group in playing)
    finally:
        if owned:
            await client.close()
    played = {t.episode_id: t for t in collector.finished}
    return [played.get(identifier) or done[identifier]
            for group in plan for identifier in (episode_id(tag, group.task, group.index, m)
                                                 for m in range(group_size))]


def collect(policy: Policy, tasks: Sequence[Task], **options: Any) -> list[Trajectory]:
    """`collect_async` for code without an event loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(collect_async(policy, tasks, **options))
    raise InvalidRequest("collect() was called inside a running event loop: await collect_async(...) instead")
