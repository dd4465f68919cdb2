"""The environments on real sandboxes: tools, observations, limits, rewards, and the Gymnasium API."""

from __future__ import annotations

import pytest

from rollbox.client import AsyncSandboxClient
from rollbox.errors import InvalidRequest
from rollbox.rl.actions import TOOLS, InvalidAction, parse_action
from rollbox.rl.env import AsyncSandboxEnv, SandboxEnv
from rollbox.rl.episode import EpisodeLimits
from tests.support.servers import example_tasks

pytestmark = pytest.mark.anyio
TASKS = example_tasks()
CENTS = next(task for task in TASKS if task.id == "ledger-format-cents")
FIX = {"tool": "str_replace", "path": "ledger/money.py", "old": '{fraction}"', "new": '{fraction:02d}"'}


def test_actions_accept_every_shape() -> None:
    bash = parse_action({"tool": "bash", "command": "ls"})
    assert parse_action('{"tool": "bash", "command": "ls"}') == bash
    assert parse_action({"name": "bash", "arguments": '{"command": "ls"}'}) == bash
    assert parse_action({"name": "bash", "arguments": {"command": "ls"}}) == bash
    with pytest.raises(InvalidAction, match="tools: bash, read_file, write_file, str_replace, submit"):
        parse_action({"tool": "rm"})
    with pytest.raises(InvalidAction, match="not JSON"):
        parse_action("ls -l")
    assert [tool["function"]["name"] for tool in TOOLS] == ["bash", "read_file", "write_file", "str_replace", "submit"]
    assert TOOLS[3]["function"]["parameters"]["required"] == ["path", "old", "new"]


async def test_episode_tools_and_reward(url: str) -> None:
    async with AsyncSandboxClient(url) as client, AsyncSandboxEnv(TASKS, client) as env:
        observation, info = await env.reset(options={"task": CENTS.id})
        assert observation.startswith(CENTS.problem_statement.rstrip()) and "/work/ledger" in observation
        assert info["task_id"] == CENTS.id and info["claim_ms"] >= 0
        observation, reward, terminated, truncated, info = await env.step({"tool": "bash", "command": "pwd; ls"})
        assert observation == "[exit code 0]\n/work/ledger\nledger"
        assert (reward, terminated, truncated) == (0, False, False)
        assert info["exit_code"] == 0
        observation, _, _, _, info = await env.step({"tool": "bash", "command": "echo out; echo err >&2; exit 3"})
        assert observation == "[exit code 3]\nout\n[stderr]\nerr" and info["exit_code"] == 3
        observation, _, _, _, info = await env.step({"tool": "read_file", "path": "ledger/money.py"})
        assert 'text = f"${whole:,}.{fraction}"' in observation and "exit_code" not in info
        observation, *_ = await env.step({**FIX, "old": "not there"})
        assert observation.startswith("error: ") and "not found" in observation
        observation, *_ = await env.step({**FIX, "old": "cents"})
        assert "occurs" in observation and "times" in observation
        observation, _, _, _, info = await env.step({"tool": "delete_everything"})
        assert observation.startswith("error: not a valid tool call") and info["error"] == "invalid_action"
        observation, *_ = await env.step({"tool": "write_file", "path": "notes/todo.txt", "content": "fix cents"})
        assert observation == "wrote 9 bytes to /work/ledger/notes/todo.txt"
        assert (await env.step(FIX))[0] == "replaced 1 occurrence in /work/ledger/ledger/money.py"
        observation, reward, terminated, truncated, info = await env.step({"tool": "submit"})
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert observation == "Submitted. reward 1: FAIL_TO_PASS 1/1 passed, PASS_TO_PASS 15/15 passed"
        assert info["verdict"]["resolved"] and env.episode.verdict.resolved  # type: ignore[union-attr]
        assert info["verdict"]["fail_to_pass"] == {"tests/test_money.py::test_format_small_cents": "passed"}
        with pytest.raises(InvalidAction, match="episode is over"):
            await env.step({"tool": "submit"})
        assert len(await client.list_sandboxes()) == 0, "the episode's sandbox outlived it"


async def test_limits_truncate(url: str) -> None:
    limits = EpisodeLimits(max_steps=2, command_timeout=1, max_output_chars=100)
    async with AsyncSandboxEnv([CENTS], url=url, limits=limits) as env:
        await env.reset()
        observation, *_ = await env.step({"tool": "bash", "command": "seq 1 100000"})
        assert "characters cut" in observation and observation.endswith("99999\n100000")
        observation, reward, terminated, truncated, info = await env.step({"tool": "bash", "command": "sleep 5"})
        assert observation == "[timed out after 1s]\n[episode truncated: 2 steps]" and info["exit_code"] is None
        assert (reward, terminated, truncated) == (0.0, False, True)
    async with AsyncSandboxEnv([CENTS], url=url, limits=EpisodeLimits(max_seconds=0.5)) as env:
        await env.reset()
        observation, reward, _, truncated, _ = await env.step({"tool": "bash", "command": "sleep 1"})
        assert truncated and reward == 0 and observation.endswith("[episode truncated: 0.5 seconds]")


async def test_reset_picks_tasks_by_seed_and_by_id(url: str) -> None:
    async with AsyncSandboxEnv(TASKS, url=url) as env:
        first = [(await env.reset(seed=7))[1]["task_id"]]
        first += [(await env.reset())[1]["task_id"] for _ in range(2)]
        again = [(await env.reset(seed=7))[1]["task_id"]]
        again += [(await env.reset())[1]["task_id"] for _ in range(2)]
        assert first == again
        with pytest.raises(InvalidRequest, match="no task 'nope'"):
            await env.reset(options={"task": "nope"})
    with pytest.raises(InvalidRequest, match="call reset"):
        await AsyncSandboxEnv(TASKS, url=url).step({"tool": "submit"})


def test_sync_env_is_a_gymnasium_env(url: str) -> None:
    gymnasium = pytest.importorskip("gymnasium")
    with SandboxEnv([CENTS], url=url) as env:
        assert isinstance(env, gymnasium.Env)
        observation, info = env.reset(seed=1)
        assert env.observation_space.contains(observation) and info["task_id"] == CENTS.id
        env.step(FIX)
        observation, reward, terminated, truncated, info = env.step('{"tool": "submit"}')
        assert (reward, terminated, truncated) == (1.0, True, False)
