"""A scripted OpenAI-compatible inference server on loopback: what a trainer's vLLM would be to the model gateway.

The model is not ours to test, so the answers are scripted: each chat completion answers the next reply of the
script of the conversation's first user message (a text, or a tool call), else `echo: <last message>`, with
usage, vLLM's token ids (`return_token_ids`) and log-probabilities (`logprobs`) when asked. Streams send one
chunk per word. The responses API answers likewise. Every request it got is kept in `requests`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollbox.client import SandboxClient
from rollbox.server.threaded import ThreadServer
from tests.support.servers import rl_server


class ScriptedModel:
    def __init__(self, scripts: dict[str, list[Any]] | None = None, delay: float = 0.0) -> None:
        self.scripts = {task: list(turns) for task, turns in (scripts or {}).items()}
        self.delay = delay
        """Seconds between the chunks of a stream."""
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def reply(self, messages: list[dict[str, Any]]) -> str | dict[str, Any]:
        first = next((m.get("content") for m in messages if m.get("role") == "user"), "") or ""
        with self._lock:
            for task, turns in self.scripts.items():
                if task in str(first) and turns:
                    return turns.pop(0)
        last = messages[-1].get("content") if messages else ""
        return f"echo: {last}"

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            body = await self._note(request)
            reply = self.reply(body.get("messages") or [])
            if body.get("stream"):
                return StreamingResponse(self._chat_stream(body, reply), media_type="text/event-stream")
            words = _words(reply)
            message: dict[str, Any] = {"role": "assistant", "content": reply if isinstance(reply, str) else None}
            if isinstance(reply, dict):
                message["tool_calls"] = [_tool_call(reply)]
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop"}
            answer: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()),
                                      "model": body.get("model"), "choices": [choice], "usage": _usage(body, words)}
            if body.get("return_token_ids"):
                answer["prompt_token_ids"] = list(range(len(json.dumps(body["messages"])) % 50))
                choice["token_ids"] = [_token(word) for word in words]
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": w, "logprob": -0.25, "bytes": None, "top_logprobs": []}
                                                  for w in words]}
            return JSONResponse(answer)

        async def responses(request: Request) -> Response:
            body = await self._note(request)
            given = body.get("input")
            reply = self.reply(given if isinstance(given, list) else [{"role": "user", "content": given}])
            text = reply if isinstance(reply, str) else json.dumps(reply)
            answer = {"id": "resp-1", "object": "response", "status": "completed", "model": body.get("model"),
                      "output": [{"type": "message", "role": "assistant",
                                  "content": [{"type": "output_text", "text": text}]}],
                      "usage": {"input_tokens": 3, "output_tokens": len(text.split()), "total_tokens": 0}}
            if not body.get("stream"):
                return JSONResponse(answer)

            async def events() -> AsyncIterator[bytes]:
                for word in text.split(" "):
                    yield _sse({"type": "response.output_text.delta", "delta": word + " "})
                yield _sse({"type": "response.completed", "response": answer})

            return StreamingResponse(events(), media_type="text/event-stream")

        async def models(request: Request) -> Response:
            self.headers.append(dict(request.headers))
            return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model"}]})

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                                 Route("/v1/responses", responses, methods=["POST"]),
                                 Route("/v1/models", models, methods=["GET"])])

    async def _note(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
        return body

    async def _chat_stream(self, body: dict[str, Any], reply: str | dict[str, Any]) -> AsyncIterator[bytes]:
        words = _words(reply)
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body.get("model")}
        yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
        if isinstance(reply, dict):
            call = _tool_call(reply)
            yield _sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [{
                "index": 0, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"],
                                                                               "arguments": ""}}]}}]})
            yield _sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [{
                "index": 0, "function": {"arguments": call["function"]["arguments"]}}]}}]})
        else:
            for n, word in enumerate(words):
                if self.delay:
                    await asyncio.sleep(self.delay)
                chunk: dict[str, Any] = {"index": 0, "delta": {"content": word if n == 0 else " " + word},
                                         "finish_reason": None}
                if body.get("return_token_ids"):
                    chunk["token_ids"] = [_token(word)]
                if body.get("logprobs"):
                    chunk["logprobs"] = {"content": [{"token": word, "logprob": -0.25}]}
                yield _sse({**base, "choices": [chunk]})
        yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield _sse({**base, "choices": [], "usage": _usage(body, words)})
        yield b"data: [DONE]\n\n"


def _words(reply: str | dict[str, Any]) -> list[str]:
    return (reply if isinstance(reply, str) else json.dumps(reply)).split(" ")


def _token(word: str) -> int:
    return sum(word.encode()) % 50000


def _usage(body: dict[str, Any], words: list[str]) -> dict[str, int]:
    prompt = len(json.dumps(body.get("messages", ""))) // 4
    return {"prompt_tokens": prompt, "completion_tokens": len(words), "total_tokens": prompt + len(words)}


def _tool_call(reply: dict[str, Any]) -> dict[str, Any]:
    return {"id": "call-1", "type": "function",
            "function": {"name": reply.get("name", "bash"), "arguments": json.dumps(reply.get("arguments", {}))}}


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


@contextlib.contextmanager
def serving(model: ScriptedModel) -> Iterator[str]:
    """Serves the model on 127.0.0.1 (a free port) in a thread; yields its base URL (`http://127.0.0.1:N/v1`)."""
    with ThreadServer(model.app(), tcp=True) as server:
        yield f"{server.url}/v1"


@dataclass
class Scripted:
    """A scripted upstream, and a real server (`rl-python` applied) whose sandboxes reach it through gateways."""

    model: ScriptedModel
    upstream: str
    client: SandboxClient


@contextlib.contextmanager
def scripted_gateway(data_dir: Path) -> Iterator[Scripted]:
    model = ScriptedModel()
    with serving(model) as upstream, rl_server(data_dir) as url, SandboxClient(url) as client:
        yield Scripted(model, upstream, client)
