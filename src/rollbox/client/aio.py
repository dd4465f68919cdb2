"""The asyncio SDK: `sync.py` with `await`. One `AsyncSandboxClient` per event loop; it pools connections."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine, Generator
from typing import Any, Literal, TypeVar, Unpack, overload

import httpx

from rollbox import errors, tracing
from rollbox.client import _calls as calls
from rollbox.client._call import Call, StreamCall
from rollbox.client._exchange import Exchange
from rollbox.client._http import DEFAULT_TIMEOUT, Settings, connection_failed, worth_again
from rollbox.client._images import Images, Registries
from rollbox.client._leases import DEFAULT_TTL, AsyncLease
from rollbox.client._options import ClaimOptions, Command, ExecOptions, ProgressCallback, Source
from rollbox.client._process_handles import AsyncProcessCommands, AsyncProcessHandle, AsyncShell, open_async_shell
from rollbox.client._processes import BackgroundOptions
from rollbox.client._traced import traced
from rollbox.client._transport import PoolTransport
from rollbox.models import (
    ApplyEvent,
    ExecResult,
    FileInfo,
    Health,
    LeaseRef,
    ModelCallLog,
    SandboxInfo,
    SandboxStats,
    SnapshotInfo,
    TemplateInfo,
    TrafficToken,
    VolumeInfo,
    WarmPoolInfo,
)
from rollbox.spec import Network

T = TypeVar("T")


class AsyncSandboxClient:
    """Talks to a rollbox router (`rollbox serve`). URL and token default to ROLLBOX_URL and ROLLBOX_TOKEN.

    Its connections belong to one event loop at a time: it may outlive an `asyncio.run` and go on in the next,
    but event loops running at once in different threads need a client each."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int = 256) -> None:
        self._settings = Settings(base_url, token, timeout)
        self._exchange = Exchange(self._settings, PoolTransport(self._settings.origin,
                                                                self._settings.limits(max_connections),
                                                                socket=self._settings.socket))
        self.images = Images(self._send)
        """Registry images: `await client.images.pull(...)`, `prefetch`, `list`, `remove`, `prune` (docs/images.md)."""
        self.registries = Registries(self._send)
        """The tenant's registry credentials: `login`, `list`, `logout`."""
        self._leases: list[LeaseRef] = []
        """The leases open, the last one the claims' (`lease`)."""

    @property
    def base_url(self) -> str:
        return self._settings.base_url

    def __repr__(self) -> str:
        return f"AsyncSandboxClient({self.base_url!r})"

    # -- sandboxes ---------------------------------------------------------------------------

    def create_sandbox(self, **claim: Unpack[ClaimOptions]) -> Claiming:
        """Claims a sandbox: a warm one from `warmpool` if it has one, else a new one from `template` or `snapshot`.

        Await it (`sandbox = await client.create_sandbox(...)`) or enter it
        (`async with client.create_sandbox(...) as sandbox:`, which deletes the sandbox on exit). Under the lease
        the client has open, if any; sent again with its request key after a connection error or a 503.
        """
        return Claiming(self._claim(claim))

    async def _claim(self, claim: ClaimOptions) -> AsyncSandbox:
        lease = self._leases[-1] if self._leases else None
        return AsyncSandbox(self, await self._send(calls.create_sandbox(claim, lease)))

    def lease(self, ttl: float = DEFAULT_TTL, *, lease_id: str | None = None) -> AsyncLease:
        """A lease for the sandboxes this client claims while it is open: `async with client.lease(ttl=60): ...`
        (see `SandboxClient.lease`)."""
        return AsyncLease(self._send, self._leases, ttl, lease_id)

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self, await self._send(calls.get_sandbox(sandbox_id)))

    async def list_sandboxes(self) -> list[AsyncSandbox]:
        return [AsyncSandbox(self, info) for info in await self._send(calls.list_sandboxes())]

    async def delete_sandbox(self, sandbox_id: str) -> None:
        await self._send(calls.delete_sandbox(sandbox_id))

    # -- resources ---------------------------------------------------------------------------

    async def apply(self, source: Source, on_progress: ProgressCallback | None = None) -> list[ApplyEvent]:
        """Creates or updates the templates and warm pools of a YAML file (or text); returns once all are ready."""
        return await self._send(calls.apply(source, on_progress))

    async def list_templates(self) -> list[TemplateInfo]:
        return await self._send(calls.list_templates())

    async def get_template(self, name: str) -> TemplateInfo:
        return await self._send(calls.get_template(name))

    async def delete_template(self, name: str) -> None:
        await self._send(calls.delete_template(name))

    async def list_warmpools(self) -> list[WarmPoolInfo]:
        return await self._send(calls.list_warmpools())

    async def get_warmpool(self, name: str) -> WarmPoolInfo:
        return await self._send(calls.get_warmpool(name))

    async def delete_warmpool(self, name: str) -> None:
        await self._send(calls.delete_warmpool(name))

    async def list_snapshots(self) -> list[SnapshotInfo]:
        return await self._send(calls.list_snapshots())

    async def delete_snapshot(self, name: str) -> None:
        await self._send(calls.delete_snapshot(name))

    async def create_volume(self, name: str, size: int | str) -> VolumeInfo:
        """A named volume of `size` bytes (or `1Gi`) that outlives sandboxes (docs/volumes.md)."""
        return await self._send(calls.create_volume(name, size))

    async def list_volumes(self) -> list[VolumeInfo]:
        return await self._send(calls.list_volumes())

    async def get_volume(self, name: str) -> VolumeInfo:
        return await self._send(calls.get_volume(name))

    async def delete_volume(self, name: str) -> None:
        await self._send(calls.delete_volume(name))

    async def health(self) -> Health:
        return await self._send(calls.health())

    # -- transport ---------------------------------------------------------------------------

    async def _send(self, call: Call[T] | StreamCall[T]) -> T:
        if tracing.on:
            with traced(call) as call:
                return await self._deliver(call)
        return await self._deliver(call)

    async def _deliver(self, call: Call[T] | StreamCall[T]) -> T:
        exchange = self._exchange
        try:
            if isinstance(call, StreamCall):
                return await exchange.streamed(call)
            for delay in call.delays if call.idempotent else ():
                try:
                    response = await exchange.whole(call)
                except httpx.TransportError:
                    pass
                else:
                    if not worth_again(response):
                        return call.parse(response)
                await asyncio.sleep(delay)
                call = call.again()
            response = await exchange.whole(call)
        except httpx.TransportError as error:
            raise connection_failed(self.base_url, call.method, call.path, error) from error
        return call.parse(response)

    async def close(self) -> None:
        await self._exchange.aclose()

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


class Claiming:
    """A claim on its way: awaitable for the sandbox, or an async context manager that deletes it on exit."""

    def __init__(self, claim: Coroutine[Any, Any, AsyncSandbox]) -> None:
        self._claim = claim
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._claim.__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._claim
        return self._sandbox

    async def __aexit__(self, *exc: object) -> None:
        assert self._sandbox is not None
        await self._sandbox.__aexit__(*exc)


class AsyncSandbox:
    """A claimed sandbox. Holding one costs nothing; each method is one HTTP call."""

    def __init__(self, client: AsyncSandboxClient, info: SandboxInfo) -> None:
        self._client = client
        self.info = info
        """What the router last said about this sandbox; `refresh()` asks again."""
        self.commands = AsyncCommands(client, info.id)
        self.files = AsyncFiles(client, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, template={self.info.template!r}, state={self.info.state!r})"

    async def run(self, command: Command, **options: Unpack[ExecOptions]) -> ExecResult:
        """Same as `commands.run`."""
        return await self.commands.run(command, **options)

    run_command = run

    async def refresh(self) -> AsyncSandbox:
        self.info = await self._client._send(calls.get_sandbox(self.id))
        return self

    async def reset(self) -> AsyncSandbox:
        """Back to the template's baseline: a fresh warm sandbox under the same id."""
        self.info = await self._client._send(calls.reset(self.id))
        return self

    async def fork(self, count: int) -> list[AsyncSandbox]:
        """`count` new sandboxes, each starting from this one's current state (which it keeps)."""
        return [AsyncSandbox(self._client, info) for info in await self._client._send(calls.fork(self.id, count))]

    async def snapshot(self, name: str) -> SnapshotInfo:
        """Freezes the current state under `name`; `create_sandbox(snapshot=name)` starts from it."""
        return await self._client._send(calls.snapshot(self.id, name))

    async def set_network(self, network: Network | dict[str, Any]) -> AsyncSandbox:
        """Narrows the sandbox's egress within its template's: `{"mode": "allowlist", "egress": [...]}` with fewer
        destinations, or `{"mode": "none"}`; anything its template does not allow is refused."""
        policy = network if isinstance(network, Network) else Network.model_validate(network)
        self.info = await self._client._send(calls.set_network(self.id, policy))
        return self

    async def pause(self, *, memory: bool = True) -> AsyncSandbox:
        """See `Sandbox.pause`."""
        self.info = await self._client._send(calls.pause(self.id, memory))
        return self

    async def resume(self) -> AsyncSandbox:
        self.info = await self._client._send(calls.resume(self.id))
        return self

    def url(self, port: int, path: str = "/") -> str:
        """The URL of `port` in this sandbox, through the router: send the tenant's token with each request, or the
        sandbox's `traffic_token()` (docs/ports.md)."""
        return calls.port_url(self._client.base_url, self.id, port, path)

    async def traffic_token(self) -> TrafficToken:
        """A token that opens this sandbox's ports, and nothing else, to whoever holds it."""
        return await self._client._send(calls.traffic_token(self.id))

    async def stats(self) -> SandboxStats:
        """What the sandbox uses now: memory and its peak, CPU seconds, processes, disk."""
        return await self._client._send(calls.stats(self.id))

    async def model_calls(self, offset: int = 0) -> ModelCallLog:
        """What its agent asked the policy through its model gateway, and the answers, from call `offset` on."""
        return await self._client._send(calls.model_calls(self.id, offset))

    async def shell(self, *, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None,
                    shell: str | None = None) -> AsyncShell:
        """A shell session: its directory, environment and variables carry from one command to the next."""
        return await open_async_shell(self._client, self.id, env=env, cwd=cwd, user=user, shell=shell)

    async def delete(self) -> None:
        await self._client._send(calls.delete_sandbox(self.id))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *_: object) -> None:
        with contextlib.suppress(errors.SandboxNotFound):  # deleted inside the block, or expired
            await self.delete()


class AsyncCommands(AsyncProcessCommands):
    def __init__(self, client: AsyncSandboxClient, sandbox_id: str) -> None:
        self._client = client
        self._sandbox_id = sandbox_id

    @overload
    async def run(self, command: Command, **options: Unpack[ExecOptions]) -> ExecResult: ...
    @overload
    async def run(self, command: Command, *, background: Literal[True], **options: Unpack[BackgroundOptions]
                  ) -> AsyncProcessHandle: ...
    async def run(self, command: Command, *, background: bool = False, **options: Any
                  ) -> ExecResult | AsyncProcessHandle:
        """Runs a shell string (under /bin/sh -c) or an argv list and returns when it ends or times out.

        With `on_stdout`/`on_stderr` the output is streamed to them as it is produced. With `background=True` it
        returns at once a handle on the process, which keeps running (docs/processes.md).
        """
        if background:
            return await self._start(command, options)  # type: ignore[arg-type]
        return await self._client._send(calls.exec_command(self._sandbox_id, command, **options))


class AsyncFiles:
    """Files inside the sandbox. Relative paths start at the sandbox user's home; no path leaves the sandbox."""

    def __init__(self, client: AsyncSandboxClient, sandbox_id: str) -> None:
        self._client = client
        self._sandbox_id = sandbox_id

    async def read(self, path: str) -> bytes:
        return await self._client._send(calls.read_file(self._sandbox_id, path))

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: str | bytes, *, mode: int | None = None,
              metadata: dict[str, str] | None = None) -> None:
        """Creates or replaces a file (and its missing parent directories); `metadata` is kept with it as its user
        extended attributes, and read back in `stat` and `list`."""
        await self._client._send(calls.write_file(self._sandbox_id, path, data, mode, metadata))

    async def list(self, path: str = ".") -> list[FileInfo]:
        return await self._client._send(calls.list_files(self._sandbox_id, path))

    async def stat(self, path: str) -> FileInfo:
        return await self._client._send(calls.stat_file(self._sandbox_id, path))

    async def exists(self, path: str) -> bool:
        return await self._client._send(calls.file_exists(self._sandbox_id, path))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._client._send(calls.remove_file(self._sandbox_id, path, recursive))

    async def mkdir(self, path: str) -> None:
        await self._client._send(calls.mkdir(self._sandbox_id, path))

    async def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> int:
        """Copies a local directory's contents into `remote_dir` in one request; returns how many entries landed."""
        return await self._client._send(calls.upload_dir(self._sandbox_id, local_dir, remote_dir))

    async def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> None:
        """Copies `remote_dir`'s contents into `local_dir` (created if missing) in one request."""
        await self._client._send(calls.download_dir(self._sandbox_id, remote_dir, local_dir))
