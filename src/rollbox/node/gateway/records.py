"""What a model call's answer holds for training: usage, token ids and log-probabilities, and for a stream the
answer put back together from its chunks.

Upstreams differ in what they return: OpenAI's API gives `usage` and, when asked, `logprobs`; vLLM also gives
token ids (`prompt_token_ids`, and `token_ids` per choice) when the request says `return_token_ids`. What an
answer does not hold stays None. Only the first choice's tokens are kept (an agent asks for one).
"""

from __future__ import annotations

import json
from typing import Any

from rollbox.models import ModelCall


def note_answer(call: ModelCall, answer: dict[str, Any]) -> None:
    """Fills the call's record from a whole (not streamed) answer of any endpoint."""
    call.response = answer
    _note_usage(call, answer.get("usage"))
    call.prompt_token_ids = answer.get("prompt_token_ids") or call.prompt_token_ids
    choices = answer.get("choices") or []
    if choices and isinstance(choices[0], dict):
        first = choices[0]
        call.token_ids = first.get("token_ids") or call.token_ids
        call.logprobs = _logprobs(first.get("logprobs")) or call.logprobs


def tokens_used(call: ModelCall) -> int:
    return (call.prompt_tokens or 0) + (call.completion_tokens or 0)


class StreamRecord:
    """Reads a server-sent-events answer as it passes and assembles it. Chat completions and completions come as
    chunks of choices; the responses API as events, whose last (`response.completed`) holds the whole answer."""

    def __init__(self, call: ModelCall) -> None:
        self.call = call
        self._pending = b""
        self._choices: dict[int, dict[str, Any]] = {}
        self._first: dict[str, Any] = {}
        self._token_ids: list[int] = []
        self._logprobs: list[float] = []
        self.tokens_seen = 0

    def feed(self, data: bytes) -> None:
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                try:
                    event = json.loads(line[5:])
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("type") == "response.completed" and isinstance(event.get("response"), dict):
            note_answer(self.call, event["response"])
            return
        if "choices" not in event:
            return
        if not self._first:
            self._first = {key: event[key] for key in ("id", "object", "created", "model") if key in event}
        _note_usage(self.call, event.get("usage"))
        self.call.prompt_token_ids = event.get("prompt_token_ids") or self.call.prompt_token_ids
        for chunk in event.get("choices") or []:
            self._choice(chunk)

    def _choice(self, chunk: dict[str, Any]) -> None:
        index = chunk.get("index", 0)
        choice = self._choices.setdefault(index, {"index": index, "finish_reason": None})
        if chunk.get("finish_reason"):
            choice["finish_reason"] = chunk["finish_reason"]
        if "text" in chunk:  # completions
            choice["text"] = choice.get("text", "") + (chunk["text"] or "")
        delta = chunk.get("delta") or {}
        message = choice.setdefault("message", {"role": "assistant", "content": None}) if delta else None
        if message is not None:
            for key in ("content", "reasoning_content"):
                if delta.get(key):
                    message[key] = (message.get(key) or "") + delta[key]
            for part in delta.get("tool_calls") or []:
                _merge_tool_call(message.setdefault("tool_calls", []), part)
        if index == 0:
            self._token_ids += chunk.get("token_ids") or []
            self._logprobs += _logprobs(chunk.get("logprobs")) or []
            self.tokens_seen += 1 if (delta.get("content") or chunk.get("text")) else 0

    def finish(self) -> None:
        """Puts the assembled answer into the call's record (a responses-API stream has put its own)."""
        if self._choices:
            self.call.response = {**self._first, "choices": [self._choices[i] for i in sorted(self._choices)]}
            if self.call.completion_tokens is not None or self.call.prompt_tokens is not None:
                self.call.response["usage"] = {"prompt_tokens": self.call.prompt_tokens,
                                               "completion_tokens": self.call.completion_tokens}
        self.call.token_ids = self._token_ids or self.call.token_ids
        self.call.logprobs = self._logprobs or self.call.logprobs


def _note_usage(call: ModelCall, usage: Any) -> None:
    if isinstance(usage, dict):
        call.prompt_tokens = usage.get("prompt_tokens", usage.get("input_tokens", call.prompt_tokens))
        call.completion_tokens = usage.get("completion_tokens", usage.get("output_tokens", call.completion_tokens))


def _logprobs(logprobs: Any) -> list[float] | None:
    """Chat answers list `content` entries with a `logprob` each; completions answers a `token_logprobs` list."""
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):
        return [entry["logprob"] for entry in logprobs["content"] if isinstance(entry, dict) and "logprob" in entry]
    if isinstance(logprobs.get("token_logprobs"), list):
        return [value for value in logprobs["token_logprobs"] if isinstance(value, int | float)]
    return None


def _merge_tool_call(calls: list[dict[str, Any]], part: dict[str, Any]) -> None:
    """A streamed tool call comes in pieces by index: the first with its id and name, then its arguments."""
    index = part.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    call["id"] = part.get("id") or call["id"]
    function = part.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""
