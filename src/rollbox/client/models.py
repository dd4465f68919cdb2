"""Wire shapes the SDK reads and writes besides those of `rollbox.models` and `rollbox.node.models`.

Answers ignore fields they do not know, so an older SDK keeps working against a newer router.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollbox.models import ExecResult


class Request(BaseModel):
    """A request body: typos in field names fail here, before anything is sent."""

    model_config = ConfigDict(extra="forbid")


class Health(BaseModel):
    status: str
    sandboxes: int = 0
    max_sandboxes: int | None = None
    """The most sandboxes the node runs (claimed, warm and starting); None from a server that does not say."""
    claims: int = 0
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


class ApplyRequest(Request):
    documents: list[dict[str, Any]]
    context_dir: str


class ForkRequest(Request):
    count: int = Field(ge=1)


class SnapshotRequest(Request):
    name: str
