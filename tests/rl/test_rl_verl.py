"""The verl tools on the real `verl` package: verl builds them from a tool config YAML and its own `ToolAgentLoop`
runs whole trajectories through them (hermes tool calls parsed from generated tokens, tool responses merged back
into the token stream, tool rewards collected).

The model is not verl's to test, nor ours: the loop's LLM server is a script that answers each turn with the next
text of a trajectory, tokenized by a byte-level tokenizer built here (no model files are downloaded). verl needs
torch: the `verl` extra installs its CPU build.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("verl.experimental.agent_loop")

from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools.tool_registry import initialize_tools_from_config
from verl.workers.rollout.replica import TokenOutput

from rollbox.rl.adapters.verl_tool import RollboxTool
from tests.support.servers import EXAMPLES

pytestmark = pytest.mark.slow  # importing verl (and torch) takes seconds
TOOL_NAMES = ["bash", "read_file", "write_file", "str_replace", "submit"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")
TURNS = {"max_user_turns": 8, "max_assistant_turns": 8, "max_parallel_calls": 1, "format": "hermes",
         "max_tool_response_length": 4000, "tool_response_truncate_side": "middle"}
TRAINER = {"actor_rollout_ref": {"rollout": {"multi_turn": TURNS, "prompt_length": 8192, "response_length": 16384,
                                             "full_determinism": False}}}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte, and `<|end|>`: any text round-trips, and the chat template is ours."""
    vocab = {char: index for index, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|end|>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|end|>", chat_template=CHAT_TEMPLATE)


class ScriptedServer:
    """verl's LLM server client, answering each trajectory (by its first prompt) from a script of turns."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, scripts: dict[str, list[dict]]) -> None:
        self.tokenizer = tokenizer
        self.scripts = {task: list(turns) for task, turns in scripts.items()}

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **_: object
                       ) -> TokenOutput:
        prompt = self.tokenizer.decode(prompt_ids)
        task = next(task for task in self.scripts if f"<user>{task}<|end|>" in prompt)
        call = self.scripts[task].pop(0)
        text = f"<tool_call>{json.dumps(call)}</tool_call>" if call else "I am done."
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def test_tool_agent_loop_runs_rollbox_tools(url: str, tmp_path: Path) -> None:
    config = tmp_path / "tools.yaml"
    config.write_text(json.dumps({"tools": [
        {"class_name": "rollbox.rl.adapters.verl_tool.RollboxTool",
         "config": {"type": "native", "tool": name, "tasks": str(EXAMPLES / "tasks"), "url": url}}
        for name in TOOL_NAMES]}))
    tools = initialize_tools_from_config(str(config))
    assert [tool.name for tool in tools] == TOOL_NAMES and all(isinstance(tool, RollboxTool) for tool in tools)

    fix = {"path": "ledger/money.py", "old": '{fraction}"', "new": '{fraction:02d}"'}
    scripts = {
        "fix it": [{"name": "bash", "arguments": {"command": "grep -c fraction ledger/money.py"}},
                   {"name": "str_replace", "arguments": fix},
                   {"name": "submit", "arguments": {}}, {}],
        "leave it": [{"name": "read_file", "arguments": {"path": "ledger/money.py"}},
                     {"name": "submit", "arguments": {}}, {}],
        "walk away": [{"name": "str_replace", "arguments": fix}, {}],
    }
    tokenizer = byte_tokenizer()
    row = {"tools_kwargs": {name: {"create_kwargs": {"task_id": "ledger-format-cents"}} for name in TOOL_NAMES}}

    async def rollouts() -> list:
        loop = ToolAgentLoop(trainer_config=DictConfigWrap(OmegaConf.create(TRAINER)),
                             server_manager=ScriptedServer(tokenizer, scripts), tokenizer=tokenizer, processor=None,
                             dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})),
                             tools=ToolListWrap(tools))
        return await asyncio.gather(*(loop.run({}, raw_prompt=[{"role": "user", "content": task}], **row)
                                      for task in scripts))

    fixed, left, walked = asyncio.run(rollouts())
    assert fixed.extra_fields["tool_rewards"] == [0.0, 0.0, 1.0]
    transcript = tokenizer.decode(fixed.response_ids)
    assert "<tool>[exit code 0]\n5<|end|>" in transcript and "<tool>Submitted. reward 1" in transcript
    assert fixed.response_logprobs is not None and sum(fixed.response_mask) < len(fixed.response_mask)
    assert left.extra_fields["tool_rewards"] == [0.0, 0.0]
    assert "def format_amount" in tokenizer.decode(left.response_ids)
    # A trajectory that never submits keeps its sandbox until the trainer closes it: the fix alone earns the reward.
    assert walked.extra_fields["tool_rewards"] == [0.0] and walked.num_turns == 4
    assert RollboxTool._sessions
    open_trajectory = next(iter(RollboxTool._sessions))
    assert asyncio.run(RollboxTool.close_trajectory(open_trajectory)) == 1.0
    assert not RollboxTool._sessions
