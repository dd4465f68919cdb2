"""Wire shapes only the SDK needs (the ones shared with the engine live in `rollbox.models`).

Answers ignore fields they do not know, so an older SDK keeps working against a newer router.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollbox.models import ExecResult, SandboxState
from rollbox.spec import Seconds, TemplateSpec


class Request(BaseModel):
    """A request body: typos in field names fail here, before anything is sent."""

    model_config = ConfigDict(extra="forbid")


class SandboxInfo(BaseModel):
    """The router's `Sandbox`: a claim. Its id stays the same across `reset`."""

    id: str
    template: str
    warmpool: str | None = None
    tenant: str = "default"
    state: SandboxState
    created_at: float
    expires_at: float | None = None
    idle_pause_after: float | None = None
    snapshot: str | None = None
    parent: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class TemplateInfo(BaseModel):
    name: str
    spec: TemplateSpec
    built_at: float | None = None


class WarmPoolInfo(BaseModel):
    name: str
    template: str
    replicas: int
    ready: int = 0
    starting: int = 0


class Health(BaseModel):
    status: str
    sandboxes: int = 0
    pools: dict[str, Any] = Field(default_factory=dict)


class ApplyEvent(BaseModel):
    """One line of the apply stream; which fields are set depends on `event`."""

    event: Literal["progress", "applied", "error", "done"]
    kind: str | None = None
    name: str | None = None
    message: str | None = None
    status: Literal["created", "configured", "unchanged"] | None = None
    code: str | None = None


class ExecEvent(BaseModel):
    """One line of the exec stream: output as produced, then the result."""

    type: Literal["stdout", "stderr", "result", "error"]
    data: str = ""
    result: ExecResult | None = None
    code: str | None = None
    message: str | None = None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ArchiveResult(BaseModel):
    entries: int


class CreateRequest(Request):
    template: str | None = None
    warmpool: str | None = None
    snapshot: str | None = None
    shutdown_after: Seconds | None = None
    idle_pause_after: Seconds | None = None
    env: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class ExecRequest(Request):
    command: str | list[str]
    timeout: float | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None
    stdin: str | None = None
    output_limit: int | None = None


class ApplyRequest(Request):
    documents: list[dict[str, Any]]
    context_dir: str


class ForkRequest(Request):
    count: int = Field(ge=1)


class SnapshotRequest(Request):
    name: str
