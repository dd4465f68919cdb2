"""The `Node` interface: everything the server asks of one machine.

The server holds a `Node` and nothing below it. Today `LocalNode` runs in the server's process;
scale-out adds other implementations (a node agent behind a transport, a router placing claims
across several nodes) without touching the server. Methods are async so that a remote node is
as natural as a local one. A sandbox is named by its sandbox id, the only id a tenant sees, and `tenant`
scopes every call: another tenant's sandbox is not found.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, Protocol

from rollbox.models import (
    ApplyStatus,
    ClaimRequest,
    ExecRequest,
    ExecResult,
    ImageInfo,
    ImagesRequest,
    LeaseInfo,
    ModelCallLog,
    ProcessControl,
    ProcessEvent,
    ProcessInfo,
    ProcessRequest,
    RegistryInfo,
    RegistryLogin,
    SandboxInfo,
    SandboxStats,
    ShellCommand,
    ShellRequest,
    SnapshotInfo,
    TemplateInfo,
    VolumeInfo,
    VolumeRequest,
    WarmPoolInfo,
)
from rollbox.spec import Network, Resource

OutputCallback = Callable[[str], None]
FileOp = Literal["read", "write", "remove", "list", "stat", "mkdir", "download_tar", "upload_tar"]
"""The operations of `rollbox.engine.files.ContainerFiles`, by name, so they can cross a transport."""


class PortStream(Protocol):
    """The bytes of one connection to a port inside a sandbox (`Node.open_port`)."""

    async def read(self) -> bytes:
        """What the sandbox's server sent next (a chunk of any size); b"" once it has finished sending."""
    async def write(self, data: bytes) -> None: ...
    async def write_eof(self) -> None:
        """Tells the server nothing more is coming (it may still answer)."""
    async def close(self) -> None:
        """Ends the connection; the sandbox counts as in use until then."""


class Node(Protocol):
    # -- resources --------------------------------------------------------------------------
    async def apply(self, resource: Resource, progress: Callable[[str], None], tenant: str | None = None
                    ) -> ApplyStatus:
        """Creates or updates a template or warm pool; `progress` is called on the caller's event loop. A registry
        image it names is pulled with `tenant`'s credentials."""
    async def templates(self) -> list[TemplateInfo]: ...
    async def template(self, name: str) -> TemplateInfo: ...
    async def delete_template(self, name: str) -> None: ...
    async def warmpools(self) -> list[WarmPoolInfo]: ...
    async def warmpool(self, name: str) -> WarmPoolInfo: ...
    async def delete_warmpool(self, name: str) -> None: ...

    # -- claims -----------------------------------------------------------------------------
    async def claim(self, tenant: str, request: ClaimRequest, *, warm_only: bool = False, retry: bool = False
                    ) -> SandboxInfo:
        """A ready sandbox: from a warm pool when one has it, else started cold; the sandbox a claim with the same
        `request_key` made, if there is one. `warm_only`: never cold, but NoWarmSandbox at once, so that a router's
        edge tries another node (cluster/edge.py). `retry`: the claim is sent again, its earlier answer lost (a
        router asks every node for its key)."""
    async def answered(self, tenant: str, sandbox_id: str, taken: bool, attempt: str | None = None) -> None:
        """An answer carrying the sandbox (a claim's, or a request key lookup's) was sent to a caller still there
        (`taken`) or gone; a sandbox no answer reached ends (docs/faults.md). `attempt`: the id its caller may
        withdraw it by."""
    async def withdraw(self, attempts: list[str]) -> None:
        """The callers of these attempts dropped their answers after all (node/answers.py)."""
    async def claims(self, tenant: str, request_key: str | None = None) -> list[SandboxInfo]:
        """The tenant's sandboxes; with `request_key`, the one a claim with that key made (if any), waited for if
        under way."""
    async def get(self, tenant: str, sandbox_id: str) -> SandboxInfo: ...
    async def delete(self, tenant: str, sandbox_id: str) -> None: ...
    async def exec(self, tenant: str, sandbox_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult: ...
    async def files(self, tenant: str, sandbox_id: str, op: FileOp, path: str, **options: Any) -> Any:
        """Runs one file operation; see `ContainerFiles` for each one's options and answer."""
    async def reset(self, tenant: str, sandbox_id: str) -> SandboxInfo: ...
    async def fork(self, tenant: str, sandbox_id: str, count: int) -> list[SandboxInfo]: ...
    async def pause(self, tenant: str, sandbox_id: str, memory: bool = True) -> SandboxInfo:
        """Pauses the sandbox; without `memory` it keeps its files alone and starts afresh over them when resumed."""
    async def resume(self, tenant: str, sandbox_id: str) -> SandboxInfo: ...
    async def stats(self, tenant: str, sandbox_id: str) -> SandboxStats:
        """What the sandbox uses now: memory (and its peak), CPU seconds, processes, disk."""
    async def set_shutdown_after(self, tenant: str, sandbox_id: str, seconds: float) -> SandboxInfo:
        """Deletes the sandbox `seconds` from now instead of when its claim said."""
    async def model_calls(self, tenant: str, sandbox_id: str, offset: int = 0) -> ModelCallLog:
        """The calls its agent made through its model gateway, from `offset` on (docs/gateway.md)."""
    async def set_network(self, tenant: str, sandbox_id: str, network: Network) -> SandboxInfo:
        """Sets the sandbox's egress to `network`, within its template's (narrowing it, never widening it)."""
    async def open_port(self, tenant: str, sandbox_id: str, port: int) -> PortStream:
        """A connection to `port` on the sandbox's loopback (docs/ports.md), resuming a paused sandbox first.
        PortClosed when nothing listens there."""

    # -- leases (docs/faults.md) ------------------------------------------------------------
    async def renew_lease(self, tenant: str, lease_id: str, ttl: float) -> LeaseInfo:
        """Opens or renews the lease for `ttl` seconds from now."""
    async def close_lease(self, tenant: str, lease_id: str) -> None:
        """Ends the lease, and every sandbox claimed under it."""

    # -- processes (docs/processes.md) ------------------------------------------------------
    async def start_process(self, tenant: str, sandbox_id: str, request: ProcessRequest) -> ProcessInfo:
        """Starts a background process; it runs until it ends or is killed, or its sandbox is reset or deleted."""
    async def processes(self, tenant: str, sandbox_id: str) -> list[ProcessInfo]:
        """The sandbox's background processes, running or ended (ended ones are kept to be read back)."""
    async def process(self, tenant: str, sandbox_id: str, process_id: str) -> ProcessInfo: ...
    def process_events(self, tenant: str, sandbox_id: str, process_id: str, offset: int | None = 0
                       ) -> AsyncIterator[ProcessEvent]:
        """The process's output from byte `offset` of what is kept (0: from the start; None: from now), as it
        comes, then its `end`. Errors before the first event raise; later ones end the stream with `error`."""
    async def control_process(self, tenant: str, sandbox_id: str, process_id: str, request: ProcessControl
                              ) -> None:
        """Writes stdin, closes it, resizes the terminal and sends a signal, as `request` says, in that order."""
    async def delete_process(self, tenant: str, sandbox_id: str, process_id: str) -> None:
        """Kills the process (and all it started) if it runs, and forgets it."""
    async def start_shell(self, tenant: str, sandbox_id: str, request: ShellRequest) -> ProcessInfo: ...
    async def run_in_shell(self, tenant: str, sandbox_id: str, process_id: str, request: ShellCommand
                           ) -> ExecResult:
        """Runs one command in a shell session; a timeout interrupts the command, not the session."""

    # -- snapshots --------------------------------------------------------------------------
    async def snapshot(self, tenant: str, sandbox_id: str, name: str) -> SnapshotInfo: ...
    async def snapshots(self, tenant: str) -> list[SnapshotInfo]: ...
    async def delete_snapshot(self, tenant: str, name: str) -> None: ...

    # -- volumes (docs/volumes.md) ----------------------------------------------------------
    async def create_volume(self, tenant: str, request: VolumeRequest) -> VolumeInfo:
        """A named volume of `request.size` bytes; a claim mounts it with `ClaimRequest.volumes`."""
    async def volumes(self, tenant: str) -> list[VolumeInfo]: ...
    async def volume(self, tenant: str, name: str) -> VolumeInfo: ...
    async def delete_volume(self, tenant: str, name: str) -> None:
        """Deletes a volume no sandbox mounts (409 `volume_in_use` otherwise), with its image."""

    # -- images (docs/images.md) -------------------------------------------------------------
    async def pull_images(self, tenant: str, request: ImagesRequest, progress: Callable[[str], None]
                          ) -> list[ImageInfo]:
        """Pulls registry images with the tenant's credentials; `progress` is called on the caller's event loop."""
    async def prefetch(self, tenant: str, request: ImagesRequest) -> None:
        """Starts pulling the images in the background, so that the claims that follow start at once."""
    async def images(self, tenant: str) -> list[ImageInfo]:
        """The images the tenant pulled or claimed on this node."""
    async def remove_image(self, tenant: str, reference: str) -> None: ...
    async def prune_images(self) -> int:
        """Removes every image layer nothing holds; the bytes freed."""
    async def login(self, tenant: str, host: str, login: RegistryLogin) -> RegistryInfo:
        """Stores the tenant's credentials for a registry (replacing earlier ones)."""
    async def registries(self, tenant: str) -> list[RegistryInfo]: ...
    async def logout(self, tenant: str, host: str) -> None: ...

    # -- operations -------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """`{"sandboxes": n, "max_sandboxes": n, "claims": n, "pools": {name: {"template", "replicas", "ready",
        "starting"}}}`."""
