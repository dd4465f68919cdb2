"""An environment class for TRL's `GRPOTrainer(environment_factory=...)`.

TRL makes one instance per concurrent rollout, calls `reset(**row)` (synchronously) before each
generation, exposes every other public method as a tool (their docstrings become the tool schema),
and calls `get_reward()` once the rollout is done::

    trainer = GRPOTrainer(model=..., train_dataset=Dataset.from_list([{"prompt": [...], "task_id": t.id}, ...]),
                          environment_factory=lambda: RollboxTRLEnv(tasks, url="http://router:8080"))

The dataset's `task_id` column picks the task. The sandbox is claimed on the first tool call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollbox.errors import InvalidRequest
from rollbox.rl.episode import EpisodeLimits
from rollbox.rl.session import Session
from rollbox.rl.tasks import Task, load_tasks


class RollboxTRLEnv:
    def __init__(self, tasks: Sequence[Task] | str | Path, *, url: str | None = None, token: str | None = None,
                 limits: EpisodeLimits | None = None) -> None:
        tasks = load_tasks(tasks) if isinstance(tasks, str | Path) else tasks
        self._tasks = {task.id: task for task in tasks}
        self._options: dict[str, Any] = {"url": url, "token": token, "limits": limits}
        self._session: Session | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def reset(self, **row: Any) -> str:
        """Starts the row's task (`task_id`); the previous episode's sandbox is deleted in the background."""
        if self._session is not None and self._loop is not None and not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop)
        task_id = row.get("task_id")
        if task_id not in self._tasks:
            raise InvalidRequest(f"the row's task_id {task_id!r} is not one of the {len(self._tasks)} tasks")
        self._session = Session(self._tasks[task_id], **self._options)
        return self._session.observation

    async def _call(self, action: dict[str, Any]) -> str:
        if self._session is None:
            raise InvalidRequest("reset() was not called: TRL calls it before every rollout")
        self._loop = asyncio.get_running_loop()
        return (await self._session.step(action)).observation

    async def bash(self, command: str) -> str:
        """Runs a shell command in the repository directory.

        Args:
            command: The shell command to run.

        Returns:
            The command's exit code and output.
        """
        return await self._call({"tool": "bash", "command": command})

    async def read_file(self, path: str) -> str:
        """Reads a file.

        Args:
            path: The file's path, relative to the repository directory or absolute.

        Returns:
            The file's content.
        """
        return await self._call({"tool": "read_file", "path": path})

    async def write_file(self, path: str, content: str) -> str:
        """Creates or overwrites a file.

        Args:
            path: The file's path, relative to the repository directory or absolute.
            content: The file's new content.

        Returns:
            What was written.
        """
        return await self._call({"tool": "write_file", "path": path, "content": content})

    async def str_replace(self, path: str, old: str, new: str) -> str:
        """Replaces the one occurrence of a text in a file.

        Args:
            path: The file's path, relative to the repository directory or absolute.
            old: The exact text to replace; it must occur exactly once in the file.
            new: The text to put in its place.

        Returns:
            Whether the replacement was made.
        """
        return await self._call({"tool": "str_replace", "path": path, "old": old, "new": new})

    async def submit(self) -> str:
        """Finishes the task: hidden tests run and decide the reward.

        Returns:
            The test summary.
        """
        return await self._call({"tool": "submit"})

    async def get_reward(self) -> float:
        """The rollout's reward (the hidden tests run now if the model did not submit)."""
        if self._session is None:
            return 0.0
        self._loop = asyncio.get_running_loop()
        return await self._session.finish()
