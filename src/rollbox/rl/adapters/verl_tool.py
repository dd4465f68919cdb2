"""verl tools over rollbox: one `RollboxTool` per tool name, all calls of one trajectory on one sandbox.

verl's agent loop wraps every single tool call in create -> execute -> release with a fresh
instance id, so the episode is keyed by the trajectory (`agent_data.request_id`, passed to
`execute`) and the task comes from the row's `tools_kwargs`::

    # tool config YAML (one entry per tool: bash, read_file, write_file, str_replace, submit)
    tools:
      - class_name: rollbox.rl.adapters.verl_tool.RollboxTool
        config: {type: native, tool: bash, tasks: examples/tasks, url: "http://router:8080"}
    # each row: tools_kwargs: {bash: {create_kwargs: {task_id: ledger-format-cents}}, ...}

The submit call returns the hidden tests' reward as its tool reward; `calc_reward(instance_id)`
and `trajectory_reward(request_id)` return it too. tests/rl/test_rl_verl.py runs verl's own
`ToolAgentLoop` over these tools (the `verl` extra). Without verl installed (it needs torch) the class
keeps the same interface on a plain base.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from rollbox.errors import InvalidRequest
from rollbox.rl.actions import TOOLS
from rollbox.rl.episode import EpisodeLimits
from rollbox.rl.session import Session
from rollbox.rl.tasks import Task, load_tasks

try:
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
except ImportError:  # verl needs torch; the tool keeps verl's interface without it
    BaseTool = object
    OpenAIFunctionToolSchema = None

    @dataclass
    class ToolResponse:  # type: ignore[no-redef]
        text: str | None = None


_SCHEMAS = {tool["function"]["name"]: tool for tool in TOOLS}


@cache
def _tasks(path: str) -> dict[str, Task]:
    return {task.id: task for task in load_tasks(path)}


class RollboxTool(BaseTool):  # type: ignore[misc,valid-type]
    """config: `tool` (which rollbox tool), `tasks` (task file or directory), `url`, `token`, `max_steps`."""

    _sessions: ClassVar[dict[str, Session]] = {}
    """Open episodes by trajectory, shared by the tool instances of one worker process."""
    _rewards: ClassVar[dict[str, float]] = {}
    _trajectories: ClassVar[dict[str, str]] = {}
    """Trajectory of each live instance id."""

    def __init__(self, config: dict[str, Any], tool_schema: Any = None) -> None:
        name = config.get("tool") or (tool_schema.function.name if tool_schema else None)
        if name not in _SCHEMAS:
            raise InvalidRequest(f"config.tool must be one of {', '.join(_SCHEMAS)}, not {name!r}")
        self.config = config
        self.name = name
        self.tool_schema = tool_schema
        if OpenAIFunctionToolSchema is not None:
            super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(_SCHEMAS[name]))
        self.limits = EpisodeLimits(max_steps=int(config.get("max_steps", EpisodeLimits.max_steps)))
        self._tasks_by_instance: dict[str, str] = {}

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema or _SCHEMAS[self.name]

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid.uuid4().hex
        task_id = (kwargs.get("create_kwargs") or kwargs).get("task_id")
        if task_id is not None:
            self._tasks_by_instance[instance_id] = task_id
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict[str, Any]]:
        agent_data = kwargs.get("agent_data")
        trajectory = str(getattr(agent_data, "request_id", None) or instance_id)
        self._trajectories[instance_id] = trajectory
        session = self._sessions.get(trajectory) or self._open(trajectory, instance_id)
        result = await session.step({**parameters, "tool": self.name})
        if session.closed:
            self._rewards[trajectory] = result.reward
            self._sessions.pop(trajectory, None)
        return ToolResponse(text=result.observation), result.reward, {
            "sandbox_ms": result.info.get("sandbox_ms", 0.0), "error": result.info.get("error")}

    def _open(self, trajectory: str, instance_id: str) -> Session:
        task_id = self._tasks_by_instance.get(instance_id)
        tasks = _tasks(str(self.config["tasks"]))
        if task_id not in tasks:
            raise InvalidRequest(f"no task {task_id!r}: give tools_kwargs.{self.name}.create_kwargs.task_id")
        session = Session(tasks[task_id], url=self.config.get("url"), token=self.config.get("token"),
                          limits=self.limits)
        self._sessions[trajectory] = session
        return session

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return self.trajectory_reward(self._trajectories.get(instance_id, instance_id))

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._tasks_by_instance.pop(instance_id, None)
        self._trajectories.pop(instance_id, None)

    @classmethod
    def trajectory_reward(cls, trajectory: str) -> float:
        """The reward of a finished trajectory (0 until it submits)."""
        return cls._rewards.get(trajectory, 0.0)

    @classmethod
    async def close_trajectory(cls, trajectory: str) -> float:
        """Ends a trajectory that never submitted: verifies its sandbox, deletes it, returns the reward."""
        session = cls._sessions.pop(trajectory, None)
        if session is not None:
            cls._rewards[trajectory] = await session.finish()
        return cls.trajectory_reward(trajectory)
