"""One episode on one sandbox: tool calls in, text observations out, the reward at submit.

Both environments and the collector drive episodes through this class, so there is one place
that decides what an agent sees. Observations never carry wall-clock times or sandbox ids: the
same task, seed and actions give the same bytes.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from rollbox import tracing
from rollbox.client import AsyncSandbox, AsyncSandboxClient
from rollbox.errors import RollboxError
from rollbox.models import ExecResult
from rollbox.rl.actions import (
    Action,
    Bash,
    InvalidAction,
    ReadFile,
    StrReplace,
    Submit,
    WriteFile,
    action_dict,
    parse_action,
)
from rollbox.rl.edits import apply_edit, resolve
from rollbox.rl.prepare import prepare
from rollbox.rl.tasks import Task
from rollbox.rl.verify import Verdict, verify

CLAIM_GRACE = 300.0
"""Seconds an episode's sandbox outlives its time limit before the router deletes it anyway."""


@dataclass(frozen=True)
class EpisodeLimits:
    max_steps: int = 30
    """Tool calls before the episode is truncated (reward 0)."""
    max_seconds: float = 600.0
    """Wall time before the episode is truncated (reward 0)."""
    command_timeout: float = 60.0
    """Seconds a bash command may run unless the action asks for less."""
    max_output_chars: int = 8000
    """Characters of each command stream or file an observation shows; the middle is cut."""


@dataclass
class StepResult:
    action: Any
    """The tool call as recorded in trajectories: canonical when valid, else what the policy sent."""
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)


def truncate(text: str, limit: int) -> str:
    """Keeps the head and the tail, which is where commands put what matters."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


def intro(task: Task) -> str:
    return (f"{task.problem_statement.rstrip()}\n\n"
            f"The repository is in {task.workdir}, the working directory of your commands. "
            "Tools: bash, read_file, write_file, str_replace, submit. Submit when you are done: "
            "hidden tests decide the reward.")


async def start_episode(client: AsyncSandboxClient, task: Task, limits: EpisodeLimits
                        ) -> tuple[Episode, dict[str, Any]]:
    """Claims a warm sandbox, puts the task's start state in it, and returns the episode on it.

    The claim expires a while after the episode's time limit, so a trainer that dies mid-episode
    leaves nothing running for long.
    """
    started = time.perf_counter()
    sandbox = await client.create_sandbox(**task.start,  # type: ignore[arg-type]
                                          shutdown_after=limits.max_seconds + CLAIM_GRACE)
    claimed = time.perf_counter()
    try:
        await prepare(sandbox, task)
    except BaseException:
        with contextlib.suppress(RollboxError):
            await sandbox.delete()
        raise
    info = {"task_id": task.id, "sandbox_id": sandbox.id, "claim_ms": (claimed - started) * 1000,
            "setup_ms": (time.perf_counter() - claimed) * 1000}
    return Episode(sandbox, task, limits), info


class Episode:
    """Drives one task on one sandbox that already holds the task's start state."""

    def __init__(self, sandbox: AsyncSandbox, task: Task, limits: EpisodeLimits) -> None:
        self.sandbox = sandbox
        self.task = task
        self.limits = limits
        self.steps = 0
        self.done = False
        self.verdict: Verdict | None = None
        self.started = time.monotonic()
        self.observation = intro(task)

    async def step(self, raw: Any) -> StepResult:
        """One tool call; with tracing on, a span (`rollbox.rl.step`) whose children are its calls on the sandbox."""
        if not tracing.on:
            return await self._step(raw)
        with tracing.span("rollbox.rl.step", {"rollbox.rl.task": self.task.id, "rollbox.rl.step": self.steps + 1,
                                              "rollbox.sandbox.id": self.sandbox.id}) as span:
            result = await self._step(raw)
            span.set_attributes({"rollbox.rl.tool": result.info.get("tool", ""), "rollbox.rl.reward": result.reward})
            return result

    async def _step(self, raw: Any) -> StepResult:
        if self.done:
            raise InvalidAction("the episode is over: reset the environment to start another")
        started = time.perf_counter()
        self.steps += 1
        info: dict[str, Any] = {}
        reward, terminated = 0.0, False
        recorded = raw if isinstance(raw, str | dict | list) else repr(raw)
        try:
            action = parse_action(raw)
            recorded = action_dict(action)
            info["tool"] = action.tool
            if isinstance(action, Submit):
                self.verdict = await verify(self.sandbox, self.task)
                reward, terminated = self.verdict.reward, True
                observation = f"Submitted. {self.verdict.summary()}"
                info["verdict"] = self.verdict.model_dump()
            else:
                observation = await self._run(action, info)
        except RollboxError as error:
            observation = f"error: {error}"
            info["error"] = error.code
        truncated = not terminated and self._out_of_budget()
        if truncated:
            observation += f"\n[episode truncated: {self._budget_reason()}]"
        self.done = terminated or truncated
        info["sandbox_ms"] = (time.perf_counter() - started) * 1000
        self.observation = observation
        return StepResult(recorded, observation, reward, terminated, truncated, info)

    async def _run(self, action: Action, info: dict[str, Any]) -> str:
        limit = self.limits.max_output_chars
        if isinstance(action, Bash):
            timeout = min(action.timeout or self.limits.command_timeout, self.limits.command_timeout)
            budget = min(timeout, max(1.0, self._seconds_left()))
            result = await self.sandbox.commands.run(action.command, timeout=budget, cwd=self.task.workdir)
            info["exit_code"] = result.exit_code
            return render_exec(result, timeout, limit)
        path = resolve(self.task.workdir, action.path)
        if isinstance(action, ReadFile):
            return truncate((await self.sandbox.files.read(path)).decode("utf-8", errors="replace"), limit)
        if isinstance(action, WriteFile):
            await self.sandbox.files.write(path, action.content)
            return f"wrote {len(action.content.encode())} bytes to {path}"
        assert isinstance(action, StrReplace)
        await apply_edit(self.sandbox.files, path, action.old, action.new)
        return f"replaced 1 occurrence in {path}"

    def _seconds_left(self) -> float:
        return self.limits.max_seconds - (time.monotonic() - self.started)

    def _out_of_budget(self) -> bool:
        return self.steps >= self.limits.max_steps or self._seconds_left() <= 0

    def _budget_reason(self) -> str:
        return f"{self.limits.max_steps} steps" if self.steps >= self.limits.max_steps else \
            f"{self.limits.max_seconds:g} seconds"


def render_exec(result: ExecResult, timeout: float, limit: int) -> str:
    parts = [f"[timed out after {timeout:g}s]" if result.timed_out else f"[exit code {result.exit_code}]"]
    if result.stdout:
        parts.append(truncate(result.stdout, limit).rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + truncate(result.stderr, limit).rstrip("\n"))
    return "\n".join(parts)
