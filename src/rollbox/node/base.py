"""The `Node` interface: everything the server asks of one machine.

The server holds a `Node` and nothing below it. Today `LocalNode` runs in the server's process;
scale-out adds other implementations (a node agent behind a transport, a router placing claims
across several nodes) without touching the server. Methods are async so that a remote node is
as natural as a local one. A sandbox is named by its sandbox id, the only id a tenant sees, and `tenant`
scopes every call: another tenant's sandbox is not found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from rollbox.models import (
    ApplyStatus,
    ClaimRequest,
    ExecRequest,
    ExecResult,
    SandboxInfo,
    SandboxStats,
    SnapshotInfo,
    TemplateInfo,
    WarmPoolInfo,
)
from rollbox.spec import Resource

OutputCallback = Callable[[str], None]
FileOp = Literal["read", "write", "remove", "list", "stat", "mkdir", "download_tar", "upload_tar"]
"""The operations of `rollbox.engine.files.ContainerFiles`, by name, so they can cross a transport."""


class Node(Protocol):
    # -- resources --------------------------------------------------------------------------
    async def apply(self, resource: Resource, progress: Callable[[str], None]) -> ApplyStatus:
        """Creates or updates a template or warm pool; `progress` is called on the caller's event loop."""
    async def templates(self) -> list[TemplateInfo]: ...
    async def template(self, name: str) -> TemplateInfo: ...
    async def delete_template(self, name: str) -> None: ...
    async def warmpools(self) -> list[WarmPoolInfo]: ...
    async def warmpool(self, name: str) -> WarmPoolInfo: ...
    async def delete_warmpool(self, name: str) -> None: ...

    # -- claims -----------------------------------------------------------------------------
    async def claim(self, tenant: str, request: ClaimRequest) -> SandboxInfo:
        """A ready sandbox: from a warm pool when one has it, else started cold."""
    async def claims(self, tenant: str) -> list[SandboxInfo]: ...
    async def get(self, tenant: str, sandbox_id: str) -> SandboxInfo: ...
    async def delete(self, tenant: str, sandbox_id: str) -> None: ...
    async def exec(self, tenant: str, sandbox_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult: ...
    async def files(self, tenant: str, sandbox_id: str, op: FileOp, path: str, **options: Any) -> Any:
        """Runs one file operation; see `ContainerFiles` for each one's options and answer."""
    async def reset(self, tenant: str, sandbox_id: str) -> SandboxInfo: ...
    async def fork(self, tenant: str, sandbox_id: str, count: int) -> list[SandboxInfo]: ...
    async def pause(self, tenant: str, sandbox_id: str) -> SandboxInfo: ...
    async def resume(self, tenant: str, sandbox_id: str) -> SandboxInfo: ...
    async def stats(self, tenant: str, sandbox_id: str) -> SandboxStats:
        """What the sandbox uses now: memory (and its peak), CPU seconds, processes, disk."""

    # -- snapshots --------------------------------------------------------------------------
    async def snapshot(self, tenant: str, sandbox_id: str, name: str) -> SnapshotInfo: ...
    async def snapshots(self, tenant: str) -> list[SnapshotInfo]: ...
    async def delete_snapshot(self, tenant: str, name: str) -> None: ...

    # -- operations -------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """`{"sandboxes": n, "max_sandboxes": n, "claims": n, "pools": {name: {"template", "replicas", "ready",
        "starting"}}}`."""
