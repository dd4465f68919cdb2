"""The blocking SDK. One `SandboxClient` per process is enough: it is thread-safe and pools connections."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any, Literal, TypeVar, Unpack, overload

import httpx

from rollbox import errors, tracing
from rollbox.client import _calls as calls
from rollbox.client._call import Call, StreamCall
from rollbox.client._http import (
    DEFAULT_TIMEOUT,
    Answer,
    Settings,
    answer_of,
    connection_failed,
    error_from,
    worth_again,
)
from rollbox.client._images import Images, Registries
from rollbox.client._leases import DEFAULT_TTL, Lease
from rollbox.client._options import ClaimOptions, Command, ExecOptions, ProgressCallback, Source
from rollbox.client._process_handles import ProcessCommands, ProcessHandle, Shell, open_shell
from rollbox.client._processes import BackgroundOptions
from rollbox.client._traced import traced
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


class SandboxClient:
    """Talks to a rollbox router (`rollbox serve`). URL and token default to ROLLBOX_URL and ROLLBOX_TOKEN."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int = 256, transport: httpx.BaseTransport | None = None) -> None:
        """`transport` replaces the network (as in httpx): `httpx.MockTransport` answers calls in-process, for tests."""
        self._settings = Settings(base_url, token, timeout)
        self._http = self._settings.http_client(max_connections, transport)
        self.images = Images(self._send)
        """Registry images: `pull`, `prefetch`, `list`, `remove`, `prune` (docs/images.md)."""
        self.registries = Registries(self._send)
        """The tenant's registry credentials: `login`, `list`, `logout`."""
        self._leases: list[LeaseRef] = []
        """The leases open, the last one the claims' (`lease`)."""

    @property
    def base_url(self) -> str:
        return self._settings.base_url

    def __repr__(self) -> str:
        return f"SandboxClient({self.base_url!r})"

    # -- sandboxes ---------------------------------------------------------------------------

    def create_sandbox(self, **claim: Unpack[ClaimOptions]) -> Sandbox:
        """Claims a sandbox: a warm one from `warmpool` if it has one, else a new one from `template` or `snapshot`.

        Under the lease the client has open, if any. After a connection error or a 503 the claim is sent again with
        its request key, which answers the sandbox an earlier attempt made, if it made one (docs/faults.md)."""
        return Sandbox(self, self._send(calls.create_sandbox(claim, self._leases[-1] if self._leases else None)))

    def lease(self, ttl: float = DEFAULT_TTL, *, lease_id: str | None = None) -> Lease:
        """A lease for the sandboxes this client claims while it is open: `with client.lease(ttl=60): ...`. It is
        renewed in the background every `ttl / 3` seconds; when it is closed, or not renewed within `ttl` (the
        process died), its sandboxes end."""
        return Lease(self._send, self._leases, ttl, lease_id)

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self, self._send(calls.get_sandbox(sandbox_id)))

    def list_sandboxes(self) -> list[Sandbox]:
        return [Sandbox(self, info) for info in self._send(calls.list_sandboxes())]

    def delete_sandbox(self, sandbox_id: str) -> None:
        self._send(calls.delete_sandbox(sandbox_id))

    # -- resources ---------------------------------------------------------------------------

    def apply(self, source: Source, on_progress: ProgressCallback | None = None) -> list[ApplyEvent]:
        """Creates or updates the templates and warm pools of a YAML file (or text); returns once all are ready."""
        return self._send(calls.apply(source, on_progress))

    def list_templates(self) -> list[TemplateInfo]:
        return self._send(calls.list_templates())

    def get_template(self, name: str) -> TemplateInfo:
        return self._send(calls.get_template(name))

    def delete_template(self, name: str) -> None:
        self._send(calls.delete_template(name))

    def list_warmpools(self) -> list[WarmPoolInfo]:
        return self._send(calls.list_warmpools())

    def get_warmpool(self, name: str) -> WarmPoolInfo:
        return self._send(calls.get_warmpool(name))

    def delete_warmpool(self, name: str) -> None:
        self._send(calls.delete_warmpool(name))

    def list_snapshots(self) -> list[SnapshotInfo]:
        return self._send(calls.list_snapshots())

    def delete_snapshot(self, name: str) -> None:
        self._send(calls.delete_snapshot(name))

    def create_volume(self, name: str, size: int | str) -> VolumeInfo:
        """A named volume of `size` bytes (or `1Gi`) that outlives sandboxes: `create_sandbox(volumes=[{"name":
        name, "mount_path": "/workspace"}])` mounts it (docs/volumes.md)."""
        return self._send(calls.create_volume(name, size))

    def list_volumes(self) -> list[VolumeInfo]:
        return self._send(calls.list_volumes())

    def get_volume(self, name: str) -> VolumeInfo:
        return self._send(calls.get_volume(name))

    def delete_volume(self, name: str) -> None:
        self._send(calls.delete_volume(name))

    def health(self) -> Health:
        return self._send(calls.health())

    # -- transport ---------------------------------------------------------------------------

    def _send(self, call: Call[T] | StreamCall[T]) -> T:
        if tracing.on:
            with traced(call) as call:
                return self._deliver(call)
        return self._deliver(call)

    def _deliver(self, call: Call[T] | StreamCall[T]) -> T:
        if isinstance(call, StreamCall):
            return self._stream(call)
        for delay in call.delays if call.idempotent else ():
            try:
                response = self._request(call)
            except httpx.TransportError:
                pass
            else:
                if not worth_again(response):
                    return call.parse(response)
            time.sleep(delay)
            call = call.again()
        try:
            response = self._request(call)
        except httpx.TransportError as error:
            raise connection_failed(self.base_url, call.method, call.path, error) from error
        return call.parse(response)

    def _request(self, call: Call[T]) -> Answer:
        return answer_of(self._http.send(self._settings.request(call.method, call.path, params=call.params,
                                                                content=call.body, headers=call.headers,
                                                                wait=call.wait)))

    def _stream(self, call: StreamCall[T]) -> T:
        answer = call.answer()
        for line in self._lines(call.method, call.path, content=call.body, headers=call.headers, wait=call.wait):
            answer.feed(line)
        return answer.result()

    def _lines(self, method: str, path: str, *, params: dict[str, str] | None = None, content: str | None = None,
               headers: dict[str, str] | None = None, wait: float | None = None) -> Iterator[str]:
        """An NDJSON answer's lines as they arrive; an error answer raises."""
        request = self._settings.request(method, path, params=params, content=content, headers=headers, wait=wait)
        try:
            with contextlib.closing(self._http.send(request, stream=True)) as response:
                if not response.is_success:
                    response.read()
                    raise error_from(answer_of(response))
                yield from response.iter_lines()
        except httpx.TransportError as error:
            raise connection_failed(self.base_url, method, path, error) from error

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Sandbox:
    """A claimed sandbox. Holding one costs nothing; each method is one HTTP call."""

    def __init__(self, client: SandboxClient, info: SandboxInfo) -> None:
        self._client = client
        self.info = info
        """What the router last said about this sandbox; `refresh()` asks again."""
        self.commands = Commands(client, info.id)
        self.files = Files(client, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, template={self.info.template!r}, state={self.info.state!r})"

    def run(self, command: Command, **options: Unpack[ExecOptions]) -> ExecResult:
        """Same as `commands.run`."""
        return self.commands.run(command, **options)

    run_command = run

    def refresh(self) -> Sandbox:
        self.info = self._client._send(calls.get_sandbox(self.id))
        return self

    def reset(self) -> Sandbox:
        """Back to the template's baseline: a fresh warm sandbox under the same id."""
        self.info = self._client._send(calls.reset(self.id))
        return self

    def fork(self, count: int) -> list[Sandbox]:
        """`count` new sandboxes, each starting from this one's current state (which it keeps)."""
        return [Sandbox(self._client, info) for info in self._client._send(calls.fork(self.id, count))]

    def snapshot(self, name: str) -> SnapshotInfo:
        """Freezes the current state under `name`; `create_sandbox(snapshot=name)` starts from it."""
        return self._client._send(calls.snapshot(self.id, name))

    def set_network(self, network: Network | dict[str, Any]) -> Sandbox:
        """Narrows the sandbox's egress within its template's: `{"mode": "allowlist", "egress": [...]}` with fewer
        destinations, or `{"mode": "none"}`; anything its template does not allow is refused."""
        policy = network if isinstance(network, Network) else Network.model_validate(network)
        self.info = self._client._send(calls.set_network(self.id, policy))
        return self

    def pause(self, *, memory: bool = True) -> Sandbox:
        """Freezes the sandbox until `resume` (or traffic to its ports); `memory=False` keeps its files alone: its
        processes end, and it starts afresh over its files when resumed."""
        self.info = self._client._send(calls.pause(self.id, memory))
        return self

    def resume(self) -> Sandbox:
        self.info = self._client._send(calls.resume(self.id))
        return self

    def url(self, port: int, path: str = "/") -> str:
        """The URL of `port` in this sandbox, through the router: send the tenant's token with each request, or the
        sandbox's `traffic_token()` (docs/ports.md)."""
        return calls.port_url(self._client.base_url, self.id, port, path)

    def traffic_token(self) -> TrafficToken:
        """A token that opens this sandbox's ports, and nothing else, to whoever holds it."""
        return self._client._send(calls.traffic_token(self.id))

    def stats(self) -> SandboxStats:
        """What the sandbox uses now: memory and its peak, CPU seconds, processes, disk."""
        return self._client._send(calls.stats(self.id))

    def model_calls(self, offset: int = 0) -> ModelCallLog:
        """What its agent asked the policy through its model gateway, and the answers, from call `offset` on."""
        return self._client._send(calls.model_calls(self.id, offset))

    def shell(self, *, env: dict[str, str] | None = None, cwd: str | None = None, user: str | None = None,
              shell: str | None = None) -> Shell:
        """A shell session: its directory, environment and variables carry from one command to the next."""
        return open_shell(self._client, self.id, env=env, cwd=cwd, user=user, shell=shell)

    def delete(self) -> None:
        self._client._send(calls.delete_sandbox(self.id))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(errors.SandboxNotFound):  # deleted inside the block, or expired
            self.delete()


class Commands(ProcessCommands):
    def __init__(self, client: SandboxClient, sandbox_id: str) -> None:
        self._client = client
        self._sandbox_id = sandbox_id

    @overload
    def run(self, command: Command, **options: Unpack[ExecOptions]) -> ExecResult: ...
    @overload
    def run(self, command: Command, *, background: Literal[True], **options: Unpack[BackgroundOptions]
            ) -> ProcessHandle: ...
    def run(self, command: Command, *, background: bool = False, **options: Any) -> ExecResult | ProcessHandle:
        """Runs a shell string (under /bin/sh -c) or an argv list and returns when it ends or times out.

        With `on_stdout`/`on_stderr` the output is streamed to them as it is produced. With `background=True` it
        returns at once a handle on the process, which keeps running (docs/processes.md).
        """
        if background:
            return self._start(command, options)  # type: ignore[arg-type]
        return self._client._send(calls.exec_command(self._sandbox_id, command, **options))


class Files:
    """Files inside the sandbox. Relative paths start at the sandbox user's home; no path leaves the sandbox."""

    def __init__(self, client: SandboxClient, sandbox_id: str) -> None:
        self._client = client
        self._sandbox_id = sandbox_id

    def read(self, path: str) -> bytes:
        return self._client._send(calls.read_file(self._sandbox_id, path))

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str, data: str | bytes, *, mode: int | None = None,
              metadata: dict[str, str] | None = None) -> None:
        """Creates or replaces a file (and its missing parent directories); `metadata` is kept with it as its user
        extended attributes, and read back in `stat` and `list`."""
        self._client._send(calls.write_file(self._sandbox_id, path, data, mode, metadata))

    def list(self, path: str = ".") -> list[FileInfo]:
        return self._client._send(calls.list_files(self._sandbox_id, path))

    def stat(self, path: str) -> FileInfo:
        return self._client._send(calls.stat_file(self._sandbox_id, path))

    def exists(self, path: str) -> bool:
        return self._client._send(calls.file_exists(self._sandbox_id, path))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._client._send(calls.remove_file(self._sandbox_id, path, recursive))

    def mkdir(self, path: str) -> None:
        self._client._send(calls.mkdir(self._sandbox_id, path))

    def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> int:
        """Copies a local directory's contents into `remote_dir` in one request; returns how many entries landed."""
        return self._client._send(calls.upload_dir(self._sandbox_id, local_dir, remote_dir))

    def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> None:
        """Copies `remote_dir`'s contents into `local_dir` (created if missing) in one request."""
        self._client._send(calls.download_dir(self._sandbox_id, remote_dir, local_dir))
