"""The example's stand-in for the trainer's inference server: an OpenAI-compatible chat completions endpoint.

In training this is vLLM (or SGLang) serving the policy being trained. Here a policy with no weights plays the same
part: for the task whose problem statement opens the conversation, it samples one of the task's fixes (its
solution and its wrong candidates, as `rollbox-train`'s candidate policy does) from the request's `seed`, answers
with a bash tool call that applies it, and, once it sees the result, says it is done. Its answers carry token ids
and log-probabilities as vLLM's do (`return_token_ids`, `logprobs`): one token per word, and the log-probability of
the sampled fix.
"""

from __future__ import annotations

import json
import math
import random
import time
import zlib
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollbox.rl.tasks import Edit, Task

APPLY = """python3 - <<'EOF'
import json, pathlib
for path, old, new in json.loads({edits!r}):
    file = pathlib.Path(path)
    file.write_text(file.read_text().replace(old, new, 1))
    print("edited", path)
EOF"""


def fixes(task: Task) -> list[tuple[Edit, ...]]:
    solution = task.solution if isinstance(task.solution, tuple) else ()
    return [fix for fix in (solution, *task.candidates) if fix]


def policy_app(tasks: list[Task]) -> Starlette:
    by_statement = {task.problem_statement.strip(): task for task in tasks}

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        messages = body.get("messages") or []
        task = by_statement.get(next((m["content"].strip() for m in messages if m.get("role") == "user"), ""))
        message: dict[str, Any] = {"role": "assistant", "content": None}
        probability = 1.0
        if task is None:
            message["content"] = "I do not know this task."
        elif not any(m.get("role") == "tool" for m in messages):
            options = fixes(task)
            chosen = random.Random(f"{body.get('seed', 0)}/{task.id}").randrange(len(options))
            probability = 1 / len(options)
            edits = json.dumps([[edit.path, edit.old, edit.new] for edit in options[chosen]])
            command = APPLY.format(edits=edits)
            message["tool_calls"] = [{"id": f"call-{chosen}", "type": "function",
                                      "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]
        else:
            message["content"] = "Done: the fix is in place."
        text = message["content"] or message["tool_calls"][0]["function"]["arguments"]
        words = text.split(" ")
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
        if body.get("return_token_ids"):
            choice["token_ids"] = [zlib.crc32(word.encode()) % 32000 for word in words]
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": word, "logprob": math.log(probability) if n == 0 else 0.0}
                                              for n, word in enumerate(words)]}
        prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4
        return JSONResponse({"id": "chatcmpl-example", "object": "chat.completion", "created": int(time.time()),
                             "model": body.get("model"), "choices": [choice],
                             "usage": {"prompt_tokens": prompt, "completion_tokens": len(words),
                                       "total_tokens": prompt + len(words)}})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
