"""`SandboxEnv` (Gymnasium's API) and `AsyncSandboxEnv` (the same with `await`).

Every `reset` claims a warm sandbox for one task and puts the task's start state in it; `step`
takes a tool call and returns a text observation; `submit` runs the hidden tests and ends the
episode with their reward; the step and time limits truncate it. The sync class drives the async
one on a private loop, so both behave the same. With gymnasium installed, `SandboxEnv` is a
`gymnasium.Env`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollbox.client import AsyncSandbox, AsyncSandboxClient
from rollbox.errors import InvalidRequest, RollboxError
from rollbox.rl.episode import Episode, EpisodeLimits, start_episode
from rollbox.rl.loop import LoopThread
from rollbox.rl.tasks import Task, load_tasks

try:
    import gymnasium
except ImportError:  # gymnasium is optional: without it SandboxEnv is a plain class with the same methods
    gymnasium = None

StepTuple = tuple[str, float, bool, bool, dict[str, Any]]


class AsyncSandboxEnv:
    """Episodes over `tasks` (a list, or a task file or directory) on sandboxes claimed from `client`."""

    def __init__(self, tasks: Sequence[Task] | str | Path, client: AsyncSandboxClient | None = None, *,
                 url: str | None = None, token: str | None = None, limits: EpisodeLimits | None = None) -> None:
        self.tasks = load_tasks(tasks) if isinstance(tasks, str | Path) else list(tasks)
        if not self.tasks:
            raise InvalidRequest("the environment needs at least one task")
        self._by_id = {task.id: task for task in self.tasks}
        self._owns_client = client is None
        self.client = client or AsyncSandboxClient(url, token)
        self.limits = limits or EpisodeLimits()
        self.episode: Episode | None = None
        """The current (or last) episode; its `verdict` holds the test outcomes after submit."""
        self._sandbox: AsyncSandbox | None = None
        self._rng = random.Random()

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Starts an episode: `options={"task": id}` picks the task, else the seeded generator does."""
        await self._release()
        if seed is not None:
            self._rng = random.Random(seed)
        task = self._pick((options or {}).get("task"))
        self.episode, info = await start_episode(self.client, task, self.limits)
        self._sandbox = self.episode.sandbox
        return self.episode.observation, info

    def task(self, task_id: str) -> Task:
        """The environment's task of that id."""
        return self._pick(task_id)

    def _pick(self, choice: str | Task | None) -> Task:
        if isinstance(choice, Task):
            return choice
        if choice is None:
            return self._rng.choice(self.tasks)
        if choice not in self._by_id:
            raise InvalidRequest(f"no task {choice!r} in this environment; it has {len(self.tasks)} tasks")
        return self._by_id[choice]

    async def step(self, action: Any) -> StepTuple:
        if self.episode is None:
            raise InvalidRequest("no episode has started: call reset() first")
        result = await self.episode.step(action)
        if result.terminated or result.truncated:
            await self._release()
        return result.observation, result.reward, result.terminated, result.truncated, result.info

    async def _release(self) -> None:
        """Deletes the episode's sandbox: nothing of an episode outlives it."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            with contextlib.suppress(RollboxError):
                await sandbox.delete()

    async def close(self) -> None:
        await self._release()
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> AsyncSandboxEnv:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


_Base: Any = gymnasium.Env if gymnasium is not None else object


class SandboxEnv(_Base):
    """The blocking twin of `AsyncSandboxEnv`, with Gymnasium's API (and base class, when installed)."""

    metadata = {"render_modes": []}

    def __init__(self, tasks: Sequence[Task] | str | Path, *, url: str | None = None, token: str | None = None,
                 limits: EpisodeLimits | None = None) -> None:
        self._loop = LoopThread("rollbox-env")
        self.env = AsyncSandboxEnv(tasks, url=url, token=token, limits=limits)
        if gymnasium is not None:
            self.observation_space = TextSpace()
            self.action_space = TextSpace()

    @property
    def episode(self) -> Episode | None:
        return self.env.episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        if gymnasium is not None:
            super().reset(seed=seed)
        return self._loop.run(self.env.reset(seed=seed, options=options))

    def step(self, action: Any) -> StepTuple:
        return self._loop.run(self.env.step(action))

    def close(self) -> None:
        if not self._loop.loop.is_closed():
            self._loop.run(self.env.close())
            self._loop.close()

    def __enter__(self) -> SandboxEnv:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


if gymnasium is not None:
    class TextSpace(gymnasium.spaces.Space):
        """Any text: observations are tool output, actions are tool calls (JSON text or dicts)."""

        def __init__(self) -> None:
            super().__init__(shape=None, dtype=None)

        def contains(self, x: Any) -> bool:
            return isinstance(x, str | dict)
