"""One task's episode for the framework adapters: the sandbox is claimed on first use, because
frameworks (TRL, verl, mini-swe-agent) announce an episode in places where no event loop runs or
where it is not yet known whether the model will act at all."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any

from rollbox.client import AsyncSandboxClient
from rollbox.errors import RollboxError
from rollbox.rl.episode import Episode, EpisodeLimits, StepResult, intro, start_episode
from rollbox.rl.tasks import Task
from rollbox.rl.verify import Verdict, verify

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str | None, str | None],
                                    AsyncSandboxClient]] = weakref.WeakKeyDictionary()


def loop_client(url: str | None, token: str | None) -> AsyncSandboxClient:
    """One SDK client per event loop and router, shared by every session on that loop."""
    clients = _clients.setdefault(asyncio.get_running_loop(), {})
    if (url, token) not in clients:
        clients[(url, token)] = AsyncSandboxClient(url, token)
    return clients[(url, token)]


class Session:
    def __init__(self, task: Task, *, url: str | None = None, token: str | None = None,
                 limits: EpisodeLimits | None = None) -> None:
        self.task = task
        self.url = url
        self.token = token
        self.limits = limits or EpisodeLimits()
        self.verdict: Verdict | None = None
        self._episode: Episode | None = None
        self._lock = asyncio.Lock()
        self.closed = False

    @property
    def observation(self) -> str:
        """The first observation, known before any sandbox is claimed."""
        return intro(self.task)

    async def episode(self) -> Episode:
        async with self._lock:
            if self.closed:
                raise RollboxError(f"the episode of task {self.task.id} is over")
            if self._episode is None:
                self._episode, _ = await start_episode(loop_client(self.url, self.token), self.task, self.limits)
            return self._episode

    async def step(self, action: Any) -> StepResult:
        result = await (await self.episode()).step(action)
        if result.terminated or result.truncated:
            self.verdict = self._episode.verdict if self._episode else None
            await self.close()
        return result

    async def finish(self) -> float:
        """The episode's reward: verifies now unless the agent submitted; 0 when it never acted,
        since a valid task's start state fails its FAIL_TO_PASS tests."""
        if self.verdict is None and self._episode is not None and not self.closed:
            self.verdict = await verify(self._episode.sandbox, self.task)
        await self.close()
        return self.verdict.reward if self.verdict else 0.0

    async def close(self) -> None:
        self.closed = True
        if self._episode is not None:
            with contextlib.suppress(RollboxError):
                await self._episode.sandbox.delete()
