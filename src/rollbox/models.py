"""Result shapes shared by the engine, the server and the SDK: one pydantic model per wire shape."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ExecResult(BaseModel):
    exit_code: int | None
    """None when the command timed out."""
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    signal: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class FileInfo(BaseModel):
    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    target: str | None = None
    """Where a symlink points (as written, never resolved)."""


SandboxState = Literal["running", "paused", "stopped"]


class SandboxInfo(BaseModel):
    id: str
    template: str
    state: SandboxState
    runtime: str
    created_at: float
    expires_at: float | None = None
    snapshot: str | None = None
    parent: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class SnapshotInfo(BaseModel):
    name: str
    template: str
    created_at: float
    source: str | None = None


class SandboxStats(BaseModel):
    memory_bytes: int
    memory_peak_bytes: int
    cpu_seconds: float
    pids: int
    disk_bytes: int
