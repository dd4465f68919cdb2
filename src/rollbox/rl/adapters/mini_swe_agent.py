"""A mini-swe-agent `Environment` backed by a rollbox sandbox holding one task.

    env = RollboxEnvironment(task=task, url="http://router:8080")
    agent = DefaultAgent(model, env, **agent_config)
    agent.run(task.problem_statement)      # the agent submits with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
    env.verdict.reward                     # the hidden tests' verdict; the Submitted message carries it too
    env.close()

Commands run in the task's workdir with mini-swe-agent's output conventions (stdout and stderr
together, the exit code, an exception note on timeout).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from rollbox.rl.episode import EpisodeLimits
from rollbox.rl.loop import LoopThread
from rollbox.rl.session import Session
from rollbox.rl.tasks import Task
from rollbox.rl.verify import Verdict

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class RollboxEnvironmentConfig(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    task: Task
    url: str | None = None
    token: str | None = None
    timeout: int = 60
    """Seconds a command may run."""
    max_seconds: float = 3600.0
    """Lifetime of the episode's sandbox claim."""


class RollboxEnvironment:
    def __init__(self, *, config_class: type = RollboxEnvironmentConfig, **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        self._loop = LoopThread("rollbox-mini-swe-agent")
        self._session = Session(self.config.task, url=self.config.url, token=self.config.token,
                                limits=EpisodeLimits(max_seconds=self.config.max_seconds))
        self.verdict: Verdict | None = None

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        command = action.get("command", "")
        limit = timeout or self.config.timeout
        result = self._loop.run(self._run(command, cwd or self.config.task.workdir, limit))
        output = {"output": result.stdout + result.stderr, "returncode": -1 if result.timed_out else result.exit_code,
                  "exception_info": f"the command timed out after {limit}s" if result.timed_out else ""}
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            self._loop.run(self._session.finish())
            self.verdict = self._session.verdict
            submission = "".join(lines[1:])
            reward = self.verdict.reward if self.verdict else 0.0
            raise Submitted({"role": "exit", "content": submission, "extra": {
                "exit_status": "Submitted", "submission": submission, "reward": reward,
                "verdict": self.verdict.model_dump() if self.verdict else None}})
        return output

    async def _run(self, command: str, cwd: str, timeout: int) -> Any:
        episode = await self._session.episode()
        return await episode.sandbox.commands.run(command, cwd=cwd, timeout=timeout)

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        task = self.config.task
        return {"timeout": self.config.timeout, "cwd": task.workdir, "task_id": task.id,
                "problem_statement": task.problem_statement, "system": "Linux", **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {
            "environment": self.config.model_dump(mode="json", exclude={"token"}),
            "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}

    def close(self) -> None:
        """Deletes the sandbox and stops the environment's event loop."""
        if not self._loop.loop.is_closed():
            self._loop.run(self._session.close())
            self._loop.close()
