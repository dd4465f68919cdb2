"""The handle on one container of an engine, and what the engine tells of it."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from rollbox.engine.determinism import template_digest
from rollbox.engine.files import ContainerFiles
from rollbox.engine.store import ContainerRecord
from rollbox.errors import SandboxNotFound
from rollbox.models import ExecResult, SandboxStats, SnapshotInfo

ContainerState = Literal["running", "paused", "standby", "stopped"]
"""standby: saved to disk with its processes, resumed by its next call (gVisor)."""


class ContainerInfo(BaseModel):
    """What the engine tells of one container (the node shows tenants `rollbox.models.SandboxInfo` instead)."""

    id: str
    template: str
    state: ContainerState
    runtime: str
    created_at: float
    expires_at: float | None = None
    snapshot: str | None = None
    parent: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    seed: int | None = None
    """The seed of a deterministic container (docs/determinism.md); None for another."""
    template_digest: str = ""
    """Its template's layers, settings and deterministic machine (`determinism.template_digest`)."""

    @classmethod
    def of(cls, record: ContainerRecord) -> ContainerInfo:
        return cls(id=record.id, template=record.template, state=record.state,  # type: ignore[arg-type]
                   runtime=record.runtime, created_at=record.created_at, expires_at=record.expires_at,
                   snapshot=record.snapshot, parent=record.parent, labels=record.labels,
                   seed=record.determinism["seed"] if record.determinism else None,
                   template_digest=template_digest(record.baseline, record.determinism))


class Containers(Protocol):
    """What a handle calls: the engine's operations on a container, by its id (`Engine` is the one)."""

    def exec(self, container_id: str, command: str | Sequence[str], **options: Any) -> ExecResult: ...
    async def exec_async(self, container_id: str, command: str | Sequence[str], **options: Any) -> ExecResult: ...
    def files(self, container_id: str) -> ContainerFiles: ...
    def info(self, container_id: str) -> ContainerInfo: ...
    def stats(self, container_id: str) -> SandboxStats: ...
    def reset(self, container_id: str) -> None: ...
    def fork(self, container_id: str, count: int) -> list[Container]: ...
    def snapshot(self, container_id: str, name: str) -> SnapshotInfo: ...
    def pause(self, container_id: str) -> None: ...
    def resume(self, container_id: str) -> None: ...
    def delete(self, container_id: str) -> None: ...


class Container:
    """A handle on one container of an engine: the engine's calls with its id filled in."""

    def __init__(self, engine: Containers, container_id: str) -> None:
        self.engine = engine
        self.id = container_id

    def __repr__(self) -> str:
        return f"Container({self.id!r})"

    def exec(self, command: str | Sequence[str], **options: object) -> ExecResult:
        return self.engine.exec(self.id, command, **options)

    async def exec_async(self, command: str | Sequence[str], **options: object) -> ExecResult:
        return await self.engine.exec_async(self.id, command, **options)

    @property
    def files(self) -> ContainerFiles:
        return self.engine.files(self.id)

    @property
    def info(self) -> ContainerInfo:
        return self.engine.info(self.id)

    def stats(self) -> SandboxStats:
        return self.engine.stats(self.id)

    def reset(self) -> None:
        self.engine.reset(self.id)

    def fork(self, count: int) -> list[Container]:
        return self.engine.fork(self.id, count)

    def snapshot(self, name: str) -> SnapshotInfo:
        return self.engine.snapshot(self.id, name)

    def pause(self) -> None:
        self.engine.pause(self.id)

    def resume(self) -> None:
        self.engine.resume(self.id)

    def delete(self) -> None:
        self.engine.delete(self.id)

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(SandboxNotFound):
            self.delete()
