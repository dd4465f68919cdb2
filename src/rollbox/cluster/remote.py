"""`RemoteNode`: the `Node` interface over HTTP, to one node agent (`rollbox node`).

A node agent serves rollbox's own API; the router calls it with the cluster secret and names, in every call, the
tenant it acts for. The calls are the SDK's (client/_calls.py) and so is the connection pool: one description of
the API, read by both sides. Transport errors (httpx's) reach the caller: only the router knows whether the node
is restarting, cut off or gone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, TypeVar

from rollbox import tracing
from rollbox.client import _calls as calls
from rollbox.client import _images as images
from rollbox.client import _processes as processes
from rollbox.client._call import Call, StreamCall
from rollbox.client._exchange import Exchange
from rollbox.client._http import Settings
from rollbox.client._transport import PoolTransport
from rollbox.errors import InvalidRequest
from rollbox.models import (
    ApplyEvent,
    ApplyStatus,
    ClaimRequest,
    ExecRequest,
    ExecResult,
    Health,
    ImageInfo,
    ImagesRequest,
    LeaseInfo,
    ModelCallLog,
    ProcessControl,
    ProcessEvent,
    ProcessInfo,
    ProcessRequest,
    PullEvent,
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
from rollbox.node.base import FileOp, OutputCallback
from rollbox.server.auth import TENANT_HEADER
from rollbox.server.sandboxes import ATTEMPT_HEADER
from rollbox.spec import Network, Resource

T = TypeVar("T")
ROUTER_TENANT = "router"
"""Who templates and warm pools are changed for: the router checked the caller is an admin."""
TIMEOUT = 600.0
"""Seconds a call may take (a template build, a fork); an exec's own timeout is added to it."""


def _attempt(call: Call[T], attempt: str) -> Call[T]:
    return replace(call, headers={**(call.headers or {}), ATTEMPT_HEADER: attempt})


def no_progress(message: str) -> None:
    """For applies whose progress nobody reads: a node's share of a pool, a template copied, the same build told
    once by its first node."""


class RemoteNode:
    """One node agent at `url`. Its connections belong to the event loop that first uses it."""

    def __init__(self, url: str, secret: str, *, max_connections: int = 1024) -> None:
        self.url = url
        settings = Settings(url, secret, TIMEOUT)
        self._exchange = Exchange(settings, PoolTransport(settings.origin, settings.limits(max_connections),
                                                          socket=settings.socket))
        self._tenants: dict[str, dict[str, str]] = {}

    async def send(self, tenant: str, call: Call[T] | StreamCall[T]) -> T:
        headers = self._tenants.get(tenant)
        if headers is None:
            headers = self._tenants[tenant] = {TENANT_HEADER: tenant}
        if tracing.on:  # the node agent's spans are children of the router's
            call = tracing.propagated(call)
        if isinstance(call, StreamCall):
            return await self._exchange.streamed(call, headers)
        return call.parse(await self._exchange.whole(call, headers))

    async def forward(self, tenant: str, method: str, target: str, body: bytes, content_type: str | None,
                      wait: float | None) -> tuple[int, bytes]:
        """A call of the API as the router received it (`target`: its path and query, encoded), for `tenant`: the
        node's answer, its status and body as sent (see forwarding.py). `wait` as for the calls' (`Call.wait`)."""
        headers = {TENANT_HEADER: tenant} if content_type is None else {TENANT_HEADER: tenant,
                                                                         "content-type": content_type}
        settings = self._exchange.settings
        reply = await self._exchange.transport.send(settings.written(method, target, content=body, headers=headers),
                                                    settings.timeouts(wait))
        return reply.status_code, await reply.read()

    async def close(self) -> None:
        await self._exchange.aclose()

    # -- resources --------------------------------------------------------------------------

    async def apply(self, resource: Resource, progress: Callable[[str], None], tenant: str | None = None
                    ) -> ApplyStatus:
        def report(event: ApplyEvent) -> None:
            if event.event == "progress" and event.message:
                progress(event.message)

        events = await self.send(tenant or ROUTER_TENANT, calls.apply_resources([resource], None, report))
        return events[-1].status or "unchanged"

    async def templates(self) -> list[TemplateInfo]:
        return await self.send(ROUTER_TENANT, calls.list_templates())

    async def template(self, name: str) -> TemplateInfo:
        return await self.send(ROUTER_TENANT, calls.get_template(name))

    async def delete_template(self, name: str) -> None:
        await self.send(ROUTER_TENANT, calls.delete_template(name))

    async def warmpools(self) -> list[WarmPoolInfo]:
        return await self.send(ROUTER_TENANT, calls.list_warmpools())

    async def warmpool(self, name: str) -> WarmPoolInfo:
        return await self.send(ROUTER_TENANT, calls.get_warmpool(name))

    async def delete_warmpool(self, name: str) -> None:
        await self.send(ROUTER_TENANT, calls.delete_warmpool(name))

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, tenant: str, request: ClaimRequest, attempt: str) -> SandboxInfo:
        """`attempt`: the id the router withdraws the answer by if it drops it (node/answers.py)."""
        return await self.send(tenant, _attempt(calls.claim(request), attempt))

    async def claims(self, tenant: str, request_key: str | None = None, attempt: str | None = None
                     ) -> list[SandboxInfo]:
        call = calls.list_sandboxes(request_key)
        return await self.send(tenant, call if attempt is None else _attempt(call, attempt))

    async def withdraw(self, attempts: list[str]) -> None:
        await self.send(ROUTER_TENANT, calls.withdraw(attempts))

    async def get(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return await self.send(tenant, calls.get_sandbox(sandbox_id))

    async def delete(self, tenant: str, sandbox_id: str) -> None:
        await self.send(tenant, calls.delete_sandbox(sandbox_id))

    async def exec(self, tenant: str, sandbox_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None) -> ExecResult:
        return await self.send(tenant, calls.run(sandbox_id, request, on_stdout, on_stderr))

    async def files(self, tenant: str, sandbox_id: str, op: FileOp, path: str, **options: Any) -> Any:
        return await self.send(tenant, _file_call(sandbox_id, op, path, options))

    async def reset(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return await self.send(tenant, calls.reset(sandbox_id))

    async def fork(self, tenant: str, sandbox_id: str, count: int) -> list[SandboxInfo]:
        return await self.send(tenant, calls.fork(sandbox_id, count))

    async def set_network(self, tenant: str, sandbox_id: str, network: Network) -> SandboxInfo:
        return await self.send(tenant, calls.set_network(sandbox_id, network))

    async def pause(self, tenant: str, sandbox_id: str, memory: bool = True) -> SandboxInfo:
        return await self.send(tenant, calls.pause(sandbox_id, memory))

    async def resume(self, tenant: str, sandbox_id: str) -> SandboxInfo:
        return await self.send(tenant, calls.resume(sandbox_id))

    async def stats(self, tenant: str, sandbox_id: str) -> SandboxStats:
        return await self.send(tenant, calls.stats(sandbox_id))

    async def model_calls(self, tenant: str, sandbox_id: str, offset: int = 0) -> ModelCallLog:
        return await self.send(tenant, calls.model_calls(sandbox_id, offset))

    async def set_shutdown_after(self, tenant: str, sandbox_id: str, seconds: float) -> SandboxInfo:
        return await self.send(tenant, calls.set_shutdown_after(sandbox_id, seconds))

    async def renew_lease(self, tenant: str, lease_id: str, ttl: float) -> LeaseInfo:
        return await self.send(tenant, calls.renew_lease(lease_id, ttl))

    async def close_lease(self, tenant: str, lease_id: str) -> None:
        await self.send(tenant, calls.close_lease(lease_id))

    # -- processes --------------------------------------------------------------------------

    async def start_process(self, tenant: str, sandbox_id: str, request: ProcessRequest) -> ProcessInfo:
        return await self.send(tenant, processes.process_started(sandbox_id, request))

    async def processes(self, tenant: str, sandbox_id: str) -> list[ProcessInfo]:
        return await self.send(tenant, processes.list_processes(sandbox_id))

    async def process(self, tenant: str, sandbox_id: str, process_id: str) -> ProcessInfo:
        return await self.send(tenant, processes.get_process(sandbox_id, process_id))

    def process_events(self, tenant: str, sandbox_id: str, process_id: str, offset: int | None = 0
                       ) -> AsyncIterator[ProcessEvent]:
        """The node's stream of the process's events; the request goes out with the first event asked for."""
        headers = {TENANT_HEADER: tenant}
        if tracing.on:
            tracing.inject(headers)
        return processes.stream_events(self._exchange, sandbox_id, process_id, offset, headers)

    async def control_process(self, tenant: str, sandbox_id: str, process_id: str, request: ProcessControl
                              ) -> None:
        await self.send(tenant, processes.control_process(sandbox_id, process_id,
                                                          **request.model_dump(exclude_none=True)))

    async def delete_process(self, tenant: str, sandbox_id: str, process_id: str) -> None:
        await self.send(tenant, processes.delete_process(sandbox_id, process_id))

    async def start_shell(self, tenant: str, sandbox_id: str, request: ShellRequest) -> ProcessInfo:
        return await self.send(tenant, processes.start_shell(sandbox_id, **request.model_dump(exclude_none=True)))

    async def run_in_shell(self, tenant: str, sandbox_id: str, process_id: str, request: ShellCommand
                           ) -> ExecResult:
        return await self.send(tenant, processes.run_in_shell(sandbox_id, process_id, request.command,
                                                              request.timeout, request.output_limit))

    # -- snapshots --------------------------------------------------------------------------

    async def snapshot(self, tenant: str, sandbox_id: str, name: str) -> SnapshotInfo:
        return await self.send(tenant, calls.snapshot(sandbox_id, name))

    async def snapshots(self, tenant: str) -> list[SnapshotInfo]:
        return await self.send(tenant, calls.list_snapshots())

    async def delete_snapshot(self, tenant: str, name: str) -> None:
        await self.send(tenant, calls.delete_snapshot(name))

    # -- volumes ----------------------------------------------------------------------------

    async def create_volume(self, tenant: str, request: VolumeRequest) -> VolumeInfo:
        return await self.send(tenant, calls.create_volume(request.name, request.size))

    async def volumes(self, tenant: str) -> list[VolumeInfo]:
        return await self.send(tenant, calls.list_volumes())

    async def volume(self, tenant: str, name: str) -> VolumeInfo:
        return await self.send(tenant, calls.get_volume(name))

    async def delete_volume(self, tenant: str, name: str) -> None:
        await self.send(tenant, calls.delete_volume(name))

    # -- images -----------------------------------------------------------------------------

    async def pull_images(self, tenant: str, request: ImagesRequest, progress: Callable[[str], None]
                          ) -> list[ImageInfo]:
        def report(event: PullEvent) -> None:
            if event.event == "progress" and event.message:
                progress(event.message)

        return await self.send(tenant, images.pull(request.images, report))

    async def prefetch(self, tenant: str, request: ImagesRequest) -> None:
        await self.send(tenant, images.prefetch(request.images))

    async def images(self, tenant: str) -> list[ImageInfo]:
        return await self.send(tenant, images.list_images())

    async def remove_image(self, tenant: str, reference: str) -> None:
        await self.send(tenant, images.remove_image(reference))

    async def prune_images(self) -> int:
        return int((await self.send(ROUTER_TENANT, images.prune_images()))["freed"])

    async def login(self, tenant: str, host: str, login: RegistryLogin) -> RegistryInfo:
        return await self.send(tenant, images.login(host, login.username, login.password))

    async def registries(self, tenant: str) -> list[RegistryInfo]:
        return await self.send(tenant, images.list_registries())

    async def logout(self, tenant: str, host: str) -> None:
        await self.send(tenant, images.logout(host))

    # -- operations -------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        info: Health = await self.send(ROUTER_TENANT, calls.health())
        return info.model_dump(exclude_none=True, exclude={"status"})


def _file_call(sandbox_id: str, op: FileOp, path: str, options: dict[str, Any]) -> Call[Any]:
    """The HTTP call for one of `ContainerFiles`' operations, as the node's routes take it."""
    if op == "read":
        return calls.read_file(sandbox_id, path)
    if op == "write":
        return calls.write_file(sandbox_id, path, options["data"], options.get("mode"), options.get("metadata"))
    if op == "remove":
        return calls.remove_file(sandbox_id, path, options.get("recursive", False))
    if op == "list":
        return calls.list_files(sandbox_id, path)
    if op == "stat":
        return calls.stat_file(sandbox_id, path)
    if op == "mkdir":
        return calls.mkdir(sandbox_id, path)
    if op == "download_tar":
        return calls.download_archive(sandbox_id, path)
    if op == "upload_tar":
        return calls.upload_archive(sandbox_id, path, options["archive"])
    raise InvalidRequest(f"no such file operation: {op}")
