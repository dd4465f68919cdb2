"""The node's wire shapes: what a claim asks for and what the server hands back, one model each."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rollbox.spec import parse_seconds

PositiveSeconds = Annotated[float, BeforeValidator(parse_seconds), Field(gt=0)]


class Request(BaseModel):
    """A request body: a misspelt field is an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class ClaimRequest(Request):
    """What `POST /v1/sandboxes` asks for: a warm pool, a template or a snapshot to start from."""

    template: str | None = None
    warmpool: str | None = None
    snapshot: str | None = None
    shutdown_after: PositiveSeconds | None = None
    idle_pause_after: PositiveSeconds | None = None
    env: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class ExecRequest(Request):
    """One command. A string runs under `/bin/sh -c`; a list is the argv."""

    command: str | list[str]
    timeout: float | None = Field(None, gt=0)
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None
    stdin: str | None = None
    output_limit: int | None = Field(None, gt=0)
    isolated: bool = False
    """Run in a throw-away copy of the sandbox: what the command writes and starts is gone when it ends."""


class ClaimInfo(BaseModel):
    """The wire `Sandbox`: a claim. Its id stays the same across `reset`."""

    id: str
    template: str
    warmpool: str | None = None
    tenant: str
    state: Literal["running", "paused", "stopped"]
    """A stopped sandbox's container stopped (killed on the host, out of memory): calls fail until `reset`."""
    created_at: float
    expires_at: float | None = None
    idle_pause_after: float | None = None
    snapshot: str | None = None
    parent: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class TemplateInfo(BaseModel):
    name: str
    spec: dict[str, Any]
    built_at: float


class WarmPoolInfo(BaseModel):
    name: str
    template: str
    replicas: int
    max_replicas: int | None = None
    target: int
    """Ready sandboxes it keeps now: `replicas`, raised towards `max_replicas` by recent bursts of claims."""
    ready: int
    starting: int


ApplyStatus = Literal["created", "configured", "unchanged"]
