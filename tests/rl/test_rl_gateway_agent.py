"""mini-swe-agent running inside a sandbox as its agent, with its own LiteLLM model reaching the policy only through
the sandbox's model gateway (OPENAI_BASE_URL, OPENAI_API_KEY): the episode is solved, and the trajectory holds every
call mini-swe-agent made. The policy is a scripted OpenAI-compatible server on loopback.

The host template shares the host's /usr, not /usr/local nor the project's virtualenv, so the test builds a template
holding mini-swe-agent and what it imports, copied from this virtualenv (the sandbox's Debian python3 is the same
CPython 3.11, so the compiled wheels load there too).
"""

from __future__ import annotations

import asyncio
import importlib.metadata as metadata
import shutil
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.rl.inside import InsideAgent, run_inside
from rollbox.spec import ModelGateway
from tests.support.openai_server import ScriptedModel, serving
from tests.support.servers import example_tasks

pytest.importorskip("minisweagent")
pytestmark = pytest.mark.slow  # a template of mini-swe-agent and LiteLLM (about 300 MB) is built
IMPORTED = ("minisweagent", "litellm", "openai", "httpx", "pydantic", "jinja2", "yaml", "rich", "tenacity",
            "platformdirs", "dotenv", "tiktoken", "aiohttp", "requests", "h2")
"""What mini-swe-agent's agent, its LiteLLM model and its local environment import; their requirements come too."""
RUN = """
import os
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

model = LitellmModel(model_name="openai/policy", cost_tracking="ignore_errors",
                     model_kwargs={"api_base": os.environ["OPENAI_BASE_URL"], "api_key": os.environ["OPENAI_API_KEY"]})
agent = DefaultAgent(model, LocalEnvironment(cwd=os.getcwd()), system_template="You fix bugs.",
                     instance_template="{{task}}", step_limit=8)
print(agent.run(os.environ["TASK"])["exit_status"])
"""
TEMPLATE = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {name: mini-swe-agent}
spec:
  env: {PYTHONPATH: /opt/mswea, MSWEA_SILENT_STARTUP: "1", LITELLM_LOCAL_MODEL_COST_MAP: "True"}
  steps:
    - copy: {src: site, dest: /opt/mswea}
    - workdir: /work
"""


def stage_packages(site: Path) -> None:
    """Copies the installed distributions mini-swe-agent needs (and what they require) into `site`."""
    owners = metadata.packages_distributions()
    wanted = {owners[module][0] for module in IMPORTED}
    todo = [name for name in wanted if name != "mini-swe-agent"]  # its own extras (datasets, textual) stay out
    while todo:
        for line in metadata.distribution(todo.pop()).requires or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            try:
                name = metadata.distribution(requirement.name).metadata["Name"]
            except metadata.PackageNotFoundError:
                continue
            if name not in wanted:
                wanted.add(name)
                todo.append(name)
    for name in wanted:
        for file in metadata.distribution(name).files or []:
            source = Path(file.locate())
            if source.is_file() and ".." not in file.parts and "__pycache__" not in file.parts:
                target = site / file
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)


def test_mini_swe_agent_inside_reaches_the_policy_through_the_gateway(url: str, tmp_path: Path) -> None:
    stage_packages(tmp_path / "site")
    (tmp_path / "template.yaml").write_text(TEMPLATE)
    with SandboxClient(url) as client:
        client.apply(str(tmp_path / "template.yaml"))
    task = next(task for task in example_tasks() if task.id == "ledger-format-cents")
    task = task.model_copy(update={"template": "mini-swe-agent", "warmpool": None})
    first_line = task.problem_statement.strip().splitlines()[0]
    model = ScriptedModel({first_line: [
        {"name": "bash", "arguments": {"command": "grep -n fraction ledger/money.py"}},
        {"name": "bash", "arguments": {"command": """sed -i 's/{fraction}"/{fraction:02d}"/' ledger/money.py"""}},
        {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}},
    ]})
    agent = InsideAgent(command=["python3", "/opt/agent/run.py"], files={"/opt/agent/run.py": RUN}, timeout=300)

    async def episode(upstream: str) -> object:
        async with AsyncSandboxClient(url) as client:
            return await run_inside(client, task, agent, ModelGateway(upstream=upstream), episode_id="mswea/0")

    with serving(model) as upstream:
        trajectory = asyncio.run(episode(upstream))
    assert trajectory.error is None, trajectory.steps
    assert trajectory.steps[0].observation.strip().endswith("Submitted"), trajectory.steps[0].observation
    assert trajectory.reward == 1.0 and trajectory.resolved
    calls = trajectory.model_calls
    assert len(calls) == 3 == len(model.requests)
    assert [c.response["choices"][0]["message"]["tool_calls"][0]["function"]["name"] for c in calls] == ["bash"] * 3
    assert calls[0].request["tools"][0]["function"]["name"] == "bash"  # mini-swe-agent's own tool schema
    assert calls[1].request["messages"][-1]["role"] == "tool"  # the grep's output went back to the policy
    assert all(c.status == 200 and c.prompt_tokens for c in calls)
