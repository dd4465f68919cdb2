"""The model gateway through a real server: an agent inside the sandbox calls the OpenAI API at OPENAI_BASE_URL
with OPENAI_API_KEY, the gateway forwards to a scripted OpenAI-compatible server on loopback, and the trainer reads
every call back (`model_calls`): chat completions whole and streamed, the responses API, token ids and
log-probabilities, budgets, a template's default gateway, reset and delete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbox import errors
from tests.support.openai_server import Scripted

CALL = r'''
import json, os, sys, urllib.error, urllib.request
path, body = sys.argv[1], json.loads(sys.argv[2])
key = sys.argv[3] if len(sys.argv) > 3 else os.environ["OPENAI_API_KEY"]
request = urllib.request.Request(os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1/v1") + path,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=60) as answer:
        print(answer.status); sys.stdout.write(answer.read().decode())
except urllib.error.HTTPError as error:
    print(error.code); sys.stdout.write(error.read().decode())
'''
"""Runs in the sandbox: one call of the OpenAI API with the standard library; prints the status, then the body."""


def call(sandbox: object, path: str, body: dict | list | None, key: str | None = None) -> tuple[int, str]:
    argv = ["python3", "-c", CALL, path, json.dumps(body), *([key] if key else [])]
    result = sandbox.commands.run(argv, timeout=60)  # type: ignore[attr-defined]
    assert result.exit_code == 0, result.stderr
    status, _, text = result.stdout.partition("\n")
    return int(status), text


def chat(content: str, **options: object) -> dict:
    return {"model": "agent-asks-for-this", "messages": [{"role": "user", "content": content}], **options}


def test_calls_are_forwarded_and_recorded(scripted: Scripted) -> None:
    client, upstream = scripted.client, scripted.upstream
    model = scripted.model
    gateway = {"upstream": upstream, "api_key": "upstream-secret", "model": "policy"}
    with client.create_sandbox(template="rl-python", warmpool="rl-python", model_gateway=gateway) as sandbox:
        env = sandbox.commands.run("echo $OPENAI_BASE_URL; env").stdout
        assert env.startswith("http://127.0.0.1/v1\n") and "upstream-secret" not in env

        status, text = call(sandbox, "/chat/completions", chat("hello", logprobs=True, return_token_ids=True))
        assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == "echo: hello"
        assert model.requests[-1]["model"] == "policy"  # the gateway's model, not the agent's
        assert model.headers[-1]["authorization"] == "Bearer upstream-secret"

        status, text = call(sandbox, "/chat/completions", chat("a b c d e f", stream=True, logprobs=True,
                                                                return_token_ids=True))
        deltas = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in deltas if c["choices"])
        assert status == 200 and streamed == "echo: a b c d e f" and text.rstrip().endswith("data: [DONE]")

        assert call(sandbox, "/responses", {"model": "m", "input": "hi"})[0] == 200
        status, text = call(sandbox, "/responses", {"model": "m", "input": "hi again", "stream": True})
        assert status == 200 and "response.completed" in text
        assert call(sandbox, "/models", None)[0] == 200

        log = sandbox.model_calls()
        assert [c.endpoint for c in log.calls] == ["chat/completions"] * 2 + ["responses"] * 2 + ["models"]
        assert [c.index for c in log.calls] == [0, 1, 2, 3, 4] and log.count == 5 and log.open
        whole, streamed_call, response, response_stream, _ = log.calls
        assert whole.request["model"] == "policy" and whole.status == 200
        assert whole.response["choices"][0]["message"]["content"] == "echo: hello"
        assert whole.token_ids and len(whole.token_ids) == 2 and whole.logprobs == [-0.25, -0.25]
        assert whole.prompt_token_ids is not None and whole.completion_tokens == 2
        assert streamed_call.stream and streamed_call.response["choices"][0]["message"]["content"] == streamed
        assert len(streamed_call.token_ids) == 7 and len(streamed_call.logprobs) == 7
        assert streamed_call.completion_tokens == 7  # the gateway asked the stream for its usage
        assert response.response["output"][0]["content"][0]["text"] == "echo: hi"
        assert response_stream.response["status"] == "completed" and response_stream.completion_tokens == 3
        assert log.tokens == sum((c.prompt_tokens or 0) + (c.completion_tokens or 0) for c in log.calls)
        assert [c.index for c in sandbox.model_calls(offset=3).calls] == [3, 4]

        # A streamed tool call comes back whole in the record.
        model.scripts["run a tool"] = [{"name": "bash", "arguments": {"command": "ls -la"}}]
        call(sandbox, "/chat/completions", chat("run a tool", stream=True))
        tool = sandbox.model_calls(offset=5).calls[0].response["choices"][0]["message"]["tool_calls"][0]
        assert tool["function"] == {"name": "bash", "arguments": '{"command": "ls -la"}'}

        # The gateway moves with the sandbox to its new container at a reset; the key stays.
        sandbox.reset()
        assert call(sandbox, "/chat/completions", chat("after reset"))[0] == 200
        assert sandbox.model_calls().count == 7

        # Wrong keys and bodies get OpenAI's error shape, and a clear word.
        status, text = call(sandbox, "/chat/completions", chat("x"), key="rbx-guessed")
        assert status == 401 and json.loads(text)["error"]["code"] == "invalid_api_key"
        assert call(sandbox, "/chat/completions", [1, 2])[0] == 400
        status, text = call(sandbox, "/embeddings", {"input": "x"})
        assert status == 404 and "not an endpoint" in json.loads(text)["error"]["message"]
        sandbox_id = sandbox.id
    with pytest.raises(errors.SandboxNotFound):
        client.get_sandbox(sandbox_id).model_calls()


def test_budgets(scripted: Scripted) -> None:
    client, upstream = scripted.client, scripted.upstream
    with client.create_sandbox(template="rl-python", warmpool="rl-python",
                               model_gateway={"upstream": upstream, "max_requests": 2}) as sandbox:
        assert [call(sandbox, "/chat/completions", chat("x"))[0] for _ in range(3)] == [200, 200, 429]
        refused = sandbox.model_calls().calls[2]
        assert refused.status == 429 and "2 model calls" in (refused.error or "")
    with client.create_sandbox(template="rl-python", warmpool="rl-python",
                               model_gateway={"upstream": upstream, "max_tokens": 20}) as sandbox:
        statuses = [call(sandbox, "/chat/completions", chat("one two three"))[0] for _ in range(3)]
        assert statuses[0] == 200 and statuses[-1] == 429
        assert "tokens" in json.loads(call(sandbox, "/chat/completions", chat("x"))[1])["error"]["message"]
    with client.create_sandbox(template="rl-python", warmpool="rl-python",
                               model_gateway={"upstream": upstream, "max_seconds": 1}) as sandbox:
        sandbox.commands.run("sleep 1.2")
        status, text = call(sandbox, "/chat/completions", chat("late"))
        assert status == 429 and "seconds" in text


def test_template_gives_the_default(scripted: Scripted, tmp_path: Path) -> None:
    client, upstream = scripted.client, scripted.upstream
    template = tmp_path / "agent.yaml"
    template.write_text(f"""\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {{name: with-gateway}}
spec:
  modelGateway: {{upstream: "{upstream}", maxRequests: 5}}
""")
    client.apply(str(template))
    with client.create_sandbox(template="with-gateway") as sandbox:
        assert call(sandbox, "/chat/completions", chat("from the template"))[0] == 200
        assert sandbox.model_calls().count == 1
    with client.create_sandbox(template="rl-python", warmpool="rl-python") as plain, \
            pytest.raises(errors.NotFound, match="no model gateway"):
        plain.model_calls()
    with pytest.raises(errors.InvalidRequest, match="upstream"):
        client.create_sandbox(template="rl-python", model_gateway={"upstream": "file:///etc/passwd"})
