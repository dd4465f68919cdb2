"""A test double of the `Node` interface (`rollbox.node.base`): sandboxes, files and resources in dicts.

It keeps just enough state for the server's and SDK's tests to see their own effects (a claim can be
read back, a file written can be read), and fails on purpose where a test needs a failure: claiming
the template `boom` raises a plain exception, as a bug in a node would. No engine, no root.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rollbox.errors import (
    FileNotFound,
    SandboxNotFound,
    SnapshotNotFound,
    TemplateNotFound,
)
from rollbox.models import (
    ApplyStatus,
    ClaimRequest,
    ExecRequest,
    ExecResult,
    FileInfo,
    SandboxInfo,
    SandboxStats,
    SnapshotInfo,
    TemplateInfo,
    WarmPoolInfo,
)
from rollbox.node.base import FileOp, OutputCallback
from rollbox.spec import Resource, SandboxTemplate

FAILING_TEMPLATE = "boom"


class MemoryNode:
    """In-memory `Node`: `exec` echoes its command (`fail N` exits N); files are bytes by path."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, SandboxInfo] = {}
        self.files_of: dict[str, dict[str, bytes]] = {}
        self.resources: dict[tuple[str, str], Resource] = {}
        self.snapshots_of: dict[str, dict[str, SnapshotInfo]] = {}
        self.keys: dict[tuple[str, str], str] = {}
        """Each (tenant, request key)'s sandbox id."""
        self._next = 0

    # -- resources ---------------------------------------------------------------------------
    async def apply(self, resource: Resource, progress: Callable[[str], None], tenant: str | None = None
                    ) -> ApplyStatus:
        key = (resource.kind, resource.metadata.name)
        progress(f"applying {resource.metadata.name}")
        status: ApplyStatus = ("unchanged" if self.resources.get(key) == resource
                               else "configured" if key in self.resources else "created")
        self.resources[key] = resource
        return status

    async def templates(self) -> list[TemplateInfo]:
        return [await self.template(name) for kind, name in self.resources if kind == "SandboxTemplate"]

    async def template(self, name: str) -> TemplateInfo:
        resource = self.resources.get(("SandboxTemplate", name))
        if not isinstance(resource, SandboxTemplate):
            raise TemplateNotFound(f"template {name!r} does not exist")
        return TemplateInfo(name=name, spec=resource.spec.model_dump(), built_at=0.0)

    async def delete_template(self, name: str) -> None:
        await self.template(name)
        del self.resources[("SandboxTemplate", name)]

    async def warmpools(self) -> list[WarmPoolInfo]:
        return [await self.warmpool(name) for kind, name in self.resources if kind == "SandboxWarmPool"]

    async def warmpool(self, name: str) -> WarmPoolInfo:
        resource = self.resources.get(("SandboxWarmPool", name))
        if resource is None or isinstance(resource, SandboxTemplate):
            raise TemplateNotFound(f"warm pool {name!r} does not exist")
        spec = resource.spec
        return WarmPoolInfo(name=name, template=spec.sandbox_template_ref.name, replicas=spec.replicas,
                            target=spec.replicas, ready=spec.replicas, starting=0)

    async def delete_warmpool(self, name: str) -> None:
        await self.warmpool(name)
        del self.resources[("SandboxWarmPool", name)]

    # -- claims ------------------------------------------------------------------------------
    async def claim(self, tenant: str, request: ClaimRequest, *, warm_only: bool = False, retry: bool = False
                    ) -> SandboxInfo:
        """Every claim is warm here: nothing starts. A request key made before answers its sandbox."""
        if request.template == FAILING_TEMPLATE:
            raise RuntimeError("boom")
        made = await self.claims(tenant, request.request_key) if request.request_key else []
        if made:
            return made[0]
        info = self._add(tenant, request.template or "t", warmpool=request.warmpool, labels=request.labels or {})
        if request.request_key:
            self.keys[(tenant, request.request_key)] = info.id
        return info

    async def answered(self, tenant: str, sandbox_id: str, taken: bool, attempt: str | None = None) -> None:
        if not taken:
            self.sandboxes.pop(sandbox_id, None)

    async def withdraw(self, attempts: list[str]) -> None:
        """Nothing here is sent on by a router."""

    async def claims(self, tenant: str, request_key: str | None = None) -> list[SandboxInfo]:
        if request_key is not None:
            made = self.sandboxes.get(self.keys.get((tenant, request_key), ""))
            return [] if made is None else [made]
        return [info for info in self.sandboxes.values() if info.tenant == tenant]

    async def get(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        info = self.sandboxes.get(sandbox_id)
        if info is None or info.tenant != tenant:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
        return info

    async def delete(self, tenant: str, sandbox_id: str) -> None:
        await self.get(tenant, sandbox_id)
        del self.sandboxes[sandbox_id], self.files_of[sandbox_id]

    async def exec(self, tenant: str, sandbox_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult:
        await self.get(tenant, sandbox_id)
        command = request.command if isinstance(request.command, str) else " ".join(request.command)
        if command.startswith("fail "):
            if on_stderr:
                on_stderr("failed\n")
            return ExecResult(exit_code=int(command.split()[1]), stderr="failed\n")
        if on_stdout:
            on_stdout(f"{command}\n")
        return ExecResult(exit_code=0, stdout=f"{command}\n")

    async def files(self, tenant: str, sandbox_id: str, op: FileOp, path: str, **options: Any) -> Any:
        await self.get(tenant, sandbox_id)
        files = self.files_of[sandbox_id]
        if op == "write":
            files[path] = options["data"]
            return None
        if path not in files:
            raise FileNotFound(f"{path!r} does not exist")
        if op == "read":
            return files[path]
        if op == "stat":
            return FileInfo(path=path, name=path.rsplit("/", 1)[-1], type="file", size=len(files[path]), mode=0o644,
                            mtime=0.0)
        if op == "remove":
            del files[path]
            return None
        raise NotImplementedError(op)

    async def reset(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        self.files_of[sandbox_id] = {}
        return await self.get(tenant, sandbox_id)

    async def fork(self, tenant: str, sandbox_id: str, count: int) -> list[SandboxInfo]:
        parent = await self.get(tenant, sandbox_id)
        children = [self._add(tenant, parent.template, parent=sandbox_id) for _ in range(count)]
        for child in children:
            self.files_of[child.id] = dict(self.files_of[sandbox_id])
        return children

    async def pause(self, tenant: str, sandbox_id: str, memory: bool = True) -> SandboxInfo:
        return self._set_state(await self.get(tenant, sandbox_id), "paused")

    async def resume(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return self._set_state(await self.get(tenant, sandbox_id), "running")

    async def stats(self, tenant: str, sandbox_id: str) -> SandboxStats:
        await self.get(tenant, sandbox_id)
        disk = sum(len(data) for data in self.files_of[sandbox_id].values())
        return SandboxStats(memory_bytes=0, memory_peak_bytes=0, cpu_seconds=0.0, pids=1, disk_bytes=disk)

    # -- snapshots ---------------------------------------------------------------------------
    async def snapshot(self, tenant: str, sandbox_id: str, name: str) -> SnapshotInfo:
        info = await self.get(tenant, sandbox_id)
        snapshot = SnapshotInfo(name=name, template=info.template, created_at=time.time(), source=sandbox_id)
        self.snapshots_of.setdefault(tenant, {})[name] = snapshot
        return snapshot

    async def snapshots(self, tenant: str) -> list[SnapshotInfo]:
        return list(self.snapshots_of.get(tenant, {}).values())

    async def delete_snapshot(self, tenant: str, name: str) -> None:
        if self.snapshots_of.get(tenant, {}).pop(name, None) is None:
            raise SnapshotNotFound(f"snapshot {name!r} does not exist")

    # -- operations --------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        return {"sandboxes": len(self.sandboxes), "max_sandboxes": 8, "claims": len(self.sandboxes), "pools": {}}

    def _add(self, tenant: str, template: str, **fields: Any) -> SandboxInfo:
        info = SandboxInfo(id=f"sb-{self._next}", template=template, tenant=tenant, state="running",
                           created_at=time.time(), **fields)
        self._next += 1
        self.sandboxes[info.id] = info
        self.files_of[info.id] = {}
        return info

    def _set_state(self, info: SandboxInfo, state: str) -> SandboxInfo:
        changed = info.model_copy(update={"state": state})
        self.sandboxes[info.id] = changed
        return changed
