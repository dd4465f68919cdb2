"""The public surface is explicit and pinned, the SDK stands on the ground floor alone, and the SDK's keyword
arguments follow the wire shapes they fill."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

import rollbox
import rollbox.client
import rollbox.errors
import rollbox.rl
from rollbox.client import _options
from rollbox.models import ClaimRequest, ExecRequest

PUBLIC = {
    rollbox: ["AsyncSandboxClient", "SandboxClient", "__version__"],
    rollbox.client: ["ApplyEvent", "AsyncLease", "AsyncSandbox", "AsyncSandboxClient", "ConnectionFailed", "ExecResult",
                     "FileInfo", "Lease", "LeaseInfo", "Sandbox", "SandboxClient", "SandboxInfo", "SnapshotInfo",
                     "TemplateInfo", "VolumeInfo", "VolumeMount", "WarmPoolInfo"],
    rollbox.rl: ["AsyncSandboxEnv", "EpisodeLimits", "Observation", "SandboxEnv", "Task", "TrainConfig", "Trajectory",
                 "collect_async", "load_swebench", "load_tasks", "read_trajectories", "write_parquet"],
}


@pytest.mark.parametrize("module", PUBLIC, ids=lambda module: module.__name__)
def test_public_names_are_pinned_and_importable(module) -> None:
    assert sorted(module.__all__) == PUBLIC[module]
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_every_error_class_is_public_and_has_its_own_wire_code_or_shares_its_parent_s() -> None:
    classes = {name: value for name, value in vars(rollbox.errors).items()
               if isinstance(value, type) and issubclass(value, rollbox.errors.RollboxError)}
    assert set(classes) <= set(rollbox.errors.__all__)
    for cls in classes.values():
        assert rollbox.errors.from_code(cls.code, "x").code == cls.code
        assert 400 <= cls.status < 600
        assert cls.__name__ in rollbox.errors.__doc__, f"{cls.__name__} is missing from the tree in the docstring"


def _modules_after(statement: str) -> list[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(m for m in sys.modules if m.startswith('rollbox'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


SDK_IMPORTS = ["import rollbox.client", "from rollbox import AsyncSandboxClient, SandboxClient"]


@pytest.mark.parametrize("statement", SDK_IMPORTS)
def test_the_sdk_loads_no_module_above_the_ground_floor(statement: str) -> None:
    loaded = _modules_after(statement)
    assert "rollbox.client" in loaded
    layers = {module.split(".")[1] for module in loaded if "." in module}
    assert layers & {"node", "engine", "server", "cluster", "rl", "cli"} == set()


def test_the_sdk_s_keyword_arguments_are_the_wire_shapes_fields() -> None:
    """`create_sandbox(**options)` and `commands.run(command, **options)` are typed by TypedDicts that must name the
    request models' fields, no more and no fewer (the streaming callbacks are the SDK's own)."""
    assert set(typing.get_type_hints(_options.ClaimOptions)) == set(ClaimRequest.model_fields)
    exec_options = set(typing.get_type_hints(_options.ExecOptions)) - {"on_stdout", "on_stderr"}
    assert exec_options == set(ExecRequest.model_fields) - {"command"}
