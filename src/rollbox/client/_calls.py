"""Every API call described once, as data (`_call`): what to send and how to read the answer.

The sync and async clients differ only in how they move bytes, so both follow docs/api.md from
this one place.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from rollbox import archives, errors, spec
from rollbox.client._call import (
    JSON,
    Call,
    StreamCall,
    _body,
    _content,
    _delete,
    _dump,
    _exists,
    _get,
    _json,
    _name,
    _none,
    _post,
)
from rollbox.client._http import CLAIM_RETRY_DELAYS, Answer
from rollbox.client._options import ClaimOptions, Command, OutputCallback, ProgressCallback, Source
from rollbox.models import (
    ApplyEvent,
    ApplyRequest,
    ArchiveResult,
    BuildContext,
    ClaimRequest,
    ExecEvent,
    ExecRequest,
    ExecResult,
    FileInfo,
    ForkRequest,
    Health,
    LeaseInfo,
    LeaseRef,
    LeaseRequest,
    ModelCallLog,
    SandboxInfo,
    SandboxStats,
    ShutdownAfterRequest,
    SnapshotInfo,
    SnapshotRequest,
    TemplateInfo,
    TrafficToken,
    VolumeInfo,
    VolumeRequest,
    WarmPoolInfo,
    WithdrawRequest,
)

_HEALTH = _json(TypeAdapter(Health))
_SANDBOX = _json(TypeAdapter(SandboxInfo))
_SANDBOXES = _json(TypeAdapter(list[SandboxInfo]))
_TEMPLATE = _json(TypeAdapter(TemplateInfo))
_TEMPLATES = _json(TypeAdapter(list[TemplateInfo]))
_WARMPOOL = _json(TypeAdapter(WarmPoolInfo))
_WARMPOOLS = _json(TypeAdapter(list[WarmPoolInfo]))
_SNAPSHOT = _json(TypeAdapter(SnapshotInfo))
_STATS = _json(TypeAdapter(SandboxStats))
_SNAPSHOTS = _json(TypeAdapter(list[SnapshotInfo]))
_EXEC = _json(TypeAdapter(ExecResult))
_FILE = _json(TypeAdapter(FileInfo))
_FILES = _json(TypeAdapter(list[FileInfo]))
_ARCHIVE = _json(TypeAdapter(ArchiveResult))
_MODEL_CALLS = _json(TypeAdapter(ModelCallLog))
_TRAFFIC_TOKEN = _json(TypeAdapter(TrafficToken))
_LEASE = _json(TypeAdapter(LeaseInfo))


_BINARY = {"content-type": "application/octet-stream"}


# -- operations and resources ------------------------------------------------------------------


def health() -> Call[Health]:
    return _get("/healthz", _HEALTH)


def list_templates() -> Call[list[TemplateInfo]]:
    return _get("/v1/templates", _TEMPLATES)


def get_template(name: str) -> Call[TemplateInfo]:
    return _get(f"/v1/templates/{_name(name)}", _TEMPLATE)


def delete_template(name: str) -> Call[None]:
    return _delete(f"/v1/templates/{_name(name)}")


def list_warmpools() -> Call[list[WarmPoolInfo]]:
    return _get("/v1/warmpools", _WARMPOOLS)


def get_warmpool(name: str) -> Call[WarmPoolInfo]:
    return _get(f"/v1/warmpools/{_name(name)}", _WARMPOOL)


def delete_warmpool(name: str) -> Call[None]:
    return _delete(f"/v1/warmpools/{_name(name)}")


def list_snapshots() -> Call[list[SnapshotInfo]]:
    return _get("/v1/snapshots", _SNAPSHOTS)


def delete_snapshot(name: str) -> Call[None]:
    return _delete(f"/v1/snapshots/{_name(name)}")


def apply(source: Source, on_progress: ProgressCallback | None) -> StreamCall[list[ApplyEvent]]:
    """Validates the resources here, so a typo fails before anything is sent."""
    resources, context_dir = _load(source)
    return apply_resources(resources, context_dir, on_progress)


def apply_resources(resources: list[spec.Resource], context_dir: str | None,
                    on_progress: ProgressCallback | None) -> StreamCall[list[ApplyEvent]]:
    documents = [{"apiVersion": resource.api_version, "kind": resource.kind,  # set or not, the server needs them
                  **resource.model_dump(mode="json", by_alias=True, exclude_unset=True)} for resource in resources]
    contexts = {resource.metadata.name: _build_context(resource) for resource in resources
                if isinstance(resource, spec.SandboxTemplate) and archives.reads_files(resource)}
    body = ApplyRequest(documents=documents, context_dir=context_dir, contexts=contexts)
    return StreamCall("POST", "/v1/apply", ApplyReader(on_progress), _dump(body))


def _build_context(template: spec.SandboxTemplate) -> BuildContext:
    """What the template's build reads, packed here: the server may be on another machine."""
    if template.spec.dockerfile is not None:
        return BuildContext(archive=archives.pack_context(archives.build_context(template)),
                            dockerfile=archives.read_dockerfile(template))
    sources = [step.copy_.src for step in template.spec.steps if step.copy_ is not None]
    return BuildContext(archive=archives.pack_context(archives.build_context(template), only=sources))


def _load(source: Source) -> tuple[list[spec.Resource], str]:
    if isinstance(source, str) and "\n" in source:
        where, context_dir = "the YAML", os.getcwd()
        resources = spec.load_resources(source, context_dir)
    else:
        path = Path(source)
        where, context_dir = str(path), str(path.parent.resolve())
        try:
            resources = spec.load_file(path)
        except OSError as error:
            message = f"cannot read {path}: {error.strerror}: give a YAML file or YAML text"
            raise errors.InvalidRequest(message) from None
    if not resources:
        raise errors.InvalidResource(f"{where} holds no resources: give a SandboxTemplate or a SandboxWarmPool")
    return resources, context_dir


class ApplyReader:
    """Reports progress as it comes; raises the first error once the server is done with the rest."""

    def __init__(self, on_progress: ProgressCallback | None) -> None:
        self.on_progress = on_progress
        self.applied: list[ApplyEvent] = []
        self.failed: list[ApplyEvent] = []

    def feed(self, line: str) -> list[ApplyEvent] | None:
        event = ApplyEvent.model_validate_json(line)
        if event.event == "done":
            if self.failed:
                raise self._error()
            return self.applied
        if self.on_progress:
            self.on_progress(event)
        if event.event == "applied":
            self.applied.append(event)
        elif event.event == "error":
            self.failed.append(event)
        return None

    def _error(self) -> errors.RollboxError:
        messages = [f"{e.kind} {e.name}: {e.message}" if e.name else str(e.message) for e in self.failed]
        return errors.from_code(self.failed[0].code or "internal", "; ".join(messages))


# -- sandboxes ----------------------------------------------------------------------------------


def _sandbox(sandbox_id: str, tail: str = "") -> str:
    return f"/v1/sandboxes/{_name(sandbox_id)}{tail}"


def create_sandbox(options: ClaimOptions, lease: LeaseRef | None = None) -> Call[SandboxInfo]:
    """A claim with a request key of its own, so that it can be sent again (unless the caller gives one, or None),
    made under `lease` (the client's open lease) unless it names one, or None."""
    fields: dict[str, Any] = {"request_key": secrets.token_hex(16), **options}
    if lease is not None:
        fields.setdefault("lease", lease)
    return claim(_body(ClaimRequest, **fields))


def claim(request: ClaimRequest) -> Call[SandboxInfo]:
    """Sent again after a connection error or a 503 when it has a request key, marked as sent again (`retry`). The
    fields set, and only those, are sent: `shutdown_after: null` asks for no default."""
    return Call("POST", "/v1/sandboxes", _SANDBOX, body=request.model_dump_json(exclude_unset=True), headers=JSON,
                idempotent=request.request_key is not None, retried={"retry": "true"}, delays=CLAIM_RETRY_DELAYS)


def list_sandboxes(request_key: str | None = None) -> Call[list[SandboxInfo]]:
    return _get("/v1/sandboxes", _SANDBOXES, None if request_key is None else {"request_key": request_key})


def withdraw(attempts: list[str]) -> Call[None]:
    """A router's: the claim attempts whose answers it dropped (node/answers.py)."""
    return Call("POST", "/v1/withdrawals", _none, body=_dump(WithdrawRequest(attempts=attempts)), headers=JSON,
                idempotent=True)


def renew_lease(lease_id: str, ttl: float) -> Call[LeaseInfo]:
    return Call("PUT", f"/v1/leases/{_name(lease_id)}", _LEASE, body=_dump(LeaseRequest(ttl=ttl)), headers=JSON,
                idempotent=True)


def close_lease(lease_id: str) -> Call[None]:
    return _delete(f"/v1/leases/{_name(lease_id)}")


def get_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    return _get(_sandbox(sandbox_id), _SANDBOX)


def delete_sandbox(sandbox_id: str) -> Call[None]:
    return _delete(_sandbox(sandbox_id))


def traffic_token(sandbox_id: str) -> Call[TrafficToken]:
    return _get(_sandbox(sandbox_id, "/traffic_token"), _TRAFFIC_TOKEN)


def port_url(base_url: str, sandbox_id: str, port: int, path: str) -> str:
    """Where the router passes requests to `port` in the sandbox (docs/ports.md)."""
    if not 1 <= port <= 65535:
        raise errors.InvalidRequest(f"port {port}: give a port from 1 to 65535")
    return f"{base_url.rstrip('/')}{_sandbox(sandbox_id, f'/ports/{port}')}/{path.lstrip('/')}"


def reset(sandbox_id: str) -> Call[SandboxInfo]:
    return _post(_sandbox(sandbox_id, "/reset"), _SANDBOX)


def fork(sandbox_id: str, count: int) -> Call[list[SandboxInfo]]:
    return _post(_sandbox(sandbox_id, "/fork"), _SANDBOXES, _body(ForkRequest, count=count))


def snapshot(sandbox_id: str, name: str) -> Call[SnapshotInfo]:
    return _post(_sandbox(sandbox_id, "/snapshot"), _SNAPSHOT, _body(SnapshotRequest, name=name))


def set_network(sandbox_id: str, network: spec.Network) -> Call[SandboxInfo]:
    return Call("PUT", _sandbox(sandbox_id, "/network"), _SANDBOX, body=_dump(network), headers=JSON)


def pause(sandbox_id: str, memory: bool = True) -> Call[SandboxInfo]:
    if memory:
        return _post(_sandbox(sandbox_id, "/pause"), _SANDBOX)
    return Call("POST", _sandbox(sandbox_id, "/pause"), _SANDBOX, params={"memory": "false"})


def resume(sandbox_id: str) -> Call[SandboxInfo]:
    return _post(_sandbox(sandbox_id, "/resume"), _SANDBOX)


def set_shutdown_after(sandbox_id: str, seconds: float) -> Call[SandboxInfo]:
    body = _dump(_body(ShutdownAfterRequest, shutdown_after=seconds))
    return Call("PUT", _sandbox(sandbox_id, "/shutdown_after"), _SANDBOX, body=body, headers=JSON, idempotent=True)


def stats(sandbox_id: str) -> Call[SandboxStats]:
    return _get(_sandbox(sandbox_id, "/stats"), _STATS)


def model_calls(sandbox_id: str, offset: int) -> Call[ModelCallLog]:
    return _get(_sandbox(sandbox_id, "/model_calls"), _MODEL_CALLS, {"offset": str(offset)})


def exec_command(sandbox_id: str, command: Command, *, on_stdout: OutputCallback | None = None,
                 on_stderr: OutputCallback | None = None, **options: Any) -> Call[ExecResult] | StreamCall[ExecResult]:
    """A plain call, or a streamed one when the caller wants output as it is produced."""
    request = _body(ExecRequest, command=command if isinstance(command, str) else list(command), **options)
    return run(sandbox_id, request, on_stdout, on_stderr)


def run(sandbox_id: str, request: ExecRequest, on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None) -> Call[ExecResult] | StreamCall[ExecResult]:
    body = _dump(request)
    if on_stdout or on_stderr:
        return StreamCall("POST", _sandbox(sandbox_id, "/exec/stream"), ExecReader(on_stdout, on_stderr), body,
                          wait=request.timeout)
    return Call("POST", _sandbox(sandbox_id, "/exec"), _EXEC, body=body, headers=JSON, wait=request.timeout)


class ExecReader:
    def __init__(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None) -> None:
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr

    def feed(self, line: str) -> ExecResult | None:
        event = ExecEvent.model_validate_json(line)
        if event.type == "result":
            if event.result is None:
                raise errors.RollboxError("the exec stream ended with an empty result: the server is out of step")
            return event.result
        if event.type == "error":
            raise errors.from_code(event.code or "internal", event.message or "the command failed on the server")
        callback = self.on_stdout if event.type == "stdout" else self.on_stderr
        if callback:
            callback(event.data)
        return None


# -- files --------------------------------------------------------------------------------------


def read_file(sandbox_id: str, path: str) -> Call[bytes]:
    return _get(_sandbox(sandbox_id, "/files"), _content, {"path": path})


def write_file(sandbox_id: str, path: str, data: str | bytes, mode: int | None,
               metadata: dict[str, str] | None = None) -> Call[None]:
    params = {"path": path} if mode is None else {"path": path, "mode": str(mode)}
    if metadata:
        params["metadata"] = json.dumps(metadata)
    return Call("PUT", _sandbox(sandbox_id, "/files"), _none, params=params, body=data, headers=_BINARY,
                idempotent=True)


def remove_file(sandbox_id: str, path: str, recursive: bool) -> Call[None]:
    return _delete(_sandbox(sandbox_id, "/files"), {"path": path, "recursive": "true" if recursive else "false"})


def list_files(sandbox_id: str, path: str) -> Call[list[FileInfo]]:
    return _get(_sandbox(sandbox_id, "/files/list"), _FILES, {"path": path})


def stat_file(sandbox_id: str, path: str) -> Call[FileInfo]:
    return _get(_sandbox(sandbox_id, "/files/stat"), _FILE, {"path": path})


def file_exists(sandbox_id: str, path: str) -> Call[bool]:
    return _get(_sandbox(sandbox_id, "/files/stat"), _exists, {"path": path})


def mkdir(sandbox_id: str, path: str) -> Call[None]:
    return Call("POST", _sandbox(sandbox_id, "/files/mkdir"), _none, params={"path": path})


def upload_dir(sandbox_id: str, local_dir: str | os.PathLike[str], remote_dir: str) -> Call[int]:
    return upload_archive(sandbox_id, remote_dir, archives.pack(local_dir))


def upload_archive(sandbox_id: str, remote_dir: str, archive: bytes) -> Call[int]:
    def parse(answer: Answer) -> int:
        return _ARCHIVE(answer).entries

    return Call("PUT", _sandbox(sandbox_id, "/files/archive"), parse, params={"path": remote_dir}, body=archive,
                headers=_BINARY, idempotent=True)


def download_dir(sandbox_id: str, remote_dir: str, local_dir: str | os.PathLike[str]) -> Call[None]:
    def parse(answer: Answer) -> None:
        archives.unpack(_content(answer), local_dir)

    return _get(_sandbox(sandbox_id, "/files/archive"), parse, {"path": remote_dir})


def download_archive(sandbox_id: str, remote_dir: str) -> Call[bytes]:
    return _get(_sandbox(sandbox_id, "/files/archive"), _content, {"path": remote_dir})


# -- volumes (docs/volumes.md) ----------------------------------------------------------------------

_VOLUME = _json(TypeAdapter(VolumeInfo))
_VOLUMES = _json(TypeAdapter(list[VolumeInfo]))


def create_volume(name: str, size: int | str) -> Call[VolumeInfo]:
    return _post("/v1/volumes", _VOLUME, _body(VolumeRequest, name=name, size=size))


def list_volumes() -> Call[list[VolumeInfo]]:
    return _get("/v1/volumes", _VOLUMES)


def get_volume(name: str) -> Call[VolumeInfo]:
    return _get(f"/v1/volumes/{_name(name)}", _VOLUME)


def delete_volume(name: str) -> Call[None]:
    return _delete(f"/v1/volumes/{_name(name)}")
