"""RL on rollbox: tasks with verifiable rewards, environments, rollout collection, trajectories, adapters.

The names below load their module on first use, so `import rollbox.rl` stays cheap (gymnasium,
matplotlib and pyarrow are imported only by what needs them). See docs/tasks.md.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Task": "tasks", "load_tasks": "tasks", "load_swebench": "swebench",
    "SandboxEnv": "env", "AsyncSandboxEnv": "env", "EpisodeLimits": "episode",
    "collect_async": "collect", "Observation": "collect",
    "Trajectory": "trajectory", "read_trajectories": "trajectory", "write_parquet": "trajectory",
    "TrainConfig": "train",
}
"""`collect`, `replay` and `train` are also submodule names, so import those functions from their module."""
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"rollbox.rl.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rollbox.rl' has no attribute {name!r}")
