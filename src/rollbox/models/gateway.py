"""The wire shapes of a sandbox's model gateway (docs/gateway.md): the calls its agent made, as logged."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ModelCall(BaseModel):
    """One call an agent made through its sandbox's model gateway, as it was forwarded and answered."""

    index: int
    """Its place among the sandbox's calls, from 0."""
    endpoint: str
    """The OpenAI API path after `/v1/`: `chat/completions`, `responses`, `completions` or `models`."""
    stream: bool = False
    started_at: float
    duration_ms: float = 0.0
    status: int = 0
    """The answer's HTTP status: the upstream's, or the gateway's own (429 past a budget, 502 or 504 when the
    upstream failed or was too slow)."""
    request: dict[str, Any] | None = None
    """The request's JSON as forwarded (the gateway's `model` in place of the agent's, when it sets one)."""
    response: dict[str, Any] | None = None
    """The answer's JSON; for a stream, the answer assembled from its chunks (text, tool calls, usage)."""
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    """The completion's token ids, when the upstream returns them (vLLM's `return_token_ids`)."""
    logprobs: list[float] | None = None
    """The completion's tokens' log-probabilities, when the request asked for them (`logprobs: true`)."""


class ModelCallLog(BaseModel):
    """A sandbox's model calls from `offset` on, and what its budgets have used: `GET .../model_calls`."""

    calls: list[ModelCall] = Field(default_factory=list)
    count: int = 0
    """Calls so far, including those before `offset`."""
    tokens: int = 0
    seconds: float = 0.0
    """Since the gateway opened for the sandbox."""
    open: bool = True
    """False once the sandbox's claim has ended (its key is refused from then on)."""
