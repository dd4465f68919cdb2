"""Framework adapters on real sandboxes, each driven the way its framework drives it.

mini-swe-agent runs its own DefaultAgent; TRL's tool schemas come from transformers (what TRL
renders them with) and its calls follow GRPOTrainer (sync reset, async tools on a daemon loop).
verl's own agent loop drives its tools in test_rl_verl.py.
"""

from __future__ import annotations

import inspect
import os

import pytest

from rollbox.rl.adapters.mini_swe_agent import RollboxEnvironment
from rollbox.rl.adapters.trl_env import RollboxTRLEnv
from rollbox.rl.loop import LoopThread
from tests.support.servers import example_tasks

TASKS = example_tasks()
CENTS = next(task for task in TASKS if task.id == "ledger-format-cents")
FIX = {"path": "ledger/money.py", "old": '{fraction}"', "new": '{fraction:02d}"'}
TOOL_NAMES = ["bash", "read_file", "write_file", "str_replace", "submit"]


def test_trl_environment(url: str) -> None:
    """What GRPOTrainer does: probe the class for tools, reset per row, await tools and get_reward on its loop."""
    environment = RollboxTRLEnv(TASKS, url=url)
    members = dict(inspect.getmembers(type(environment), predicate=inspect.isfunction))
    tools = sorted(name for name in members if name not in ("reset", "get_reward") and not name.startswith("_"))
    assert tools == sorted(TOOL_NAMES)
    transformers = pytest.importorskip("transformers.utils")
    schemas = {name: transformers.get_json_schema(getattr(environment, name)) for name in tools}
    assert schemas["str_replace"]["function"]["parameters"]["required"] == ["path", "old", "new"]
    assert "exactly once" in schemas["str_replace"]["function"]["parameters"]["properties"]["old"]["description"]

    loop = LoopThread("trl-daemon")
    try:
        observation = environment.reset(task_id=CENTS.id, prompt=[{"role": "user", "content": "fix it"}])
        assert observation.startswith(CENTS.problem_statement.rstrip())
        assert "def format_amount" in loop.run(environment.read_file("ledger/money.py"))
        assert loop.run(environment.str_replace(**FIX)).startswith("replaced 1 occurrence")
        assert loop.run(environment.submit()).startswith("Submitted. reward 1")
        assert loop.run(environment.get_reward()) == 1.0
        environment.reset(task_id=CENTS.id)
        assert loop.run(environment.bash("echo $PWD")) == "[exit code 0]\n/work/ledger"
        assert loop.run(environment.get_reward()) == 0.0
        environment.reset(task_id=CENTS.id)
        assert loop.run(environment.get_reward()) == 0.0
    finally:
        loop.close()


def test_mini_swe_agent_environment(url: str) -> None:
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    pytest.importorskip("minisweagent")
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.test_models import DeterministicModel, make_output

    def run(commands: list[str]) -> tuple[dict, RollboxEnvironment]:
        outputs = [make_output(f"step {n}", [{"command": command}]) for n, command in enumerate(commands)]
        environment = RollboxEnvironment(task=CENTS, url=url)
        agent = DefaultAgent(DeterministicModel(outputs=outputs), environment, system_template="Fix the bug.",
                             instance_template="{{task}}", step_limit=10)
        try:
            return agent.run(CENTS.problem_statement), environment
        finally:
            environment.close()

    fixed, environment = run(["grep -n fraction ledger/money.py",
                              """sed -i 's/{fraction}"/{fraction:02d}"/' ledger/money.py""",
                              "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"])
    assert fixed["exit_status"] == "Submitted" and fixed["reward"] == 1.0
    assert environment.verdict is not None and environment.verdict.resolved
    assert environment.serialize()["info"]["config"]["environment_type"].endswith("RollboxEnvironment")
    unfixed, _ = run(["exit 3", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"])
    assert unfixed["exit_status"] == "Submitted" and unfixed["reward"] == 0.0
