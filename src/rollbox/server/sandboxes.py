"""Routes of `/v1/sandboxes` (claims, commands, files) and `/v1/snapshots`."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rollbox._logs import throttled
from rollbox.errors import InvalidRequest, RollboxError
from rollbox.models import (
    ArchiveResult,
    ClaimRequest,
    ExecRequest,
    ExecResult,
    FileInfo,
    ForkRequest,
    ModelCallLog,
    SandboxInfo,
    SandboxStats,
    ShutdownAfterRequest,
    SnapshotInfo,
    SnapshotRequest,
    WithdrawRequest,
)
from rollbox.node import Node
from rollbox.server.auth import ClusterSecret
from rollbox.server.hangups import hung_up
from rollbox.server.metrics import Metrics
from rollbox.server.responses import json_response, no_content
from rollbox.server.routing import Query, Routes
from rollbox.server.streams import Emit, ndjson
from rollbox.spec import Network

log = logging.getLogger("rollbox.server")

PATH = Query("path")
MAX_METADATA_KEY = 250
"""Bytes a metadata key may have: the kernel's 255 for an extended attribute's name, less its `user.`."""
WARM_ONLY = Query("warm_only", bool, False)
"""A node agent's claims only: take a warm sandbox or answer 404 no_warm_sandbox at once, for a router's edge that
tries the nodes in turn (rollbox/cluster/edge.py)."""
RETRY = Query("retry", bool, False)
"""A claim sent again with its `request_key` after its answer was lost: an earlier attempt may have made it (a
cluster's router asks every node for the key first; docs/faults.md)."""
REQUEST_KEY = Query("request_key", str, None)

ATTEMPT_HEADER = "x-rollbox-attempt"
"""The id a router or its edge gives each claim, and key lookup, it sends a node (cluster callers only): the answer
is withdrawn by it if it goes nowhere (POST /v1/withdrawals; node/answers.py)."""
EXIT_CODE_HEADER = "x-rollbox-exit-code"
"""A command's exit code, also in the header of its answer: for the router's edge, which logs the commands it
forwards without reading their answers (rollbox/cluster/edge.py)."""


def add_routes(routes: Routes, node: Node, metrics: Metrics) -> None:
    add = routes.add

    # -- claims -----------------------------------------------------------------------------

    cluster = isinstance(routes.tenants, ClusterSecret)

    @add("POST", "/v1/sandboxes", body=ClaimRequest, answer=SandboxInfo, status=201,
         query=(RETRY, WARM_ONLY) if cluster else (RETRY,), request=True)
    async def create_sandbox(tenant: str, body: ClaimRequest, request: Request, retry: bool,
                             warm_only: bool = False) -> Response:
        """Claims a sandbox: warm from a pool when one has it, else started from its template or snapshot. The same
        `request_key` sent again answers the same sandbox."""
        started = time.perf_counter()
        info = await node.claim(tenant, body, warm_only=warm_only, retry=retry)
        await answered(tenant, info, request)
        metrics.record_claim(time.perf_counter() - started)
        return json_response(info, 201)

    @add("GET", "/v1/sandboxes", answer=list[SandboxInfo], query=(REQUEST_KEY,), request=True)
    async def list_sandboxes(tenant: str, request_key: str | None, request: Request) -> Response:
        """Lists the tenant's sandboxes; with `request_key`, the one a claim with that key made, if any (a claim
        under way is waited for)."""
        found = await node.claims(tenant, request_key)
        if request_key is not None and found:  # handed out once more
            await answered(tenant, found[0], request)
        return json_response(found)

    async def answered(tenant: str, info: SandboxInfo, request: Request) -> None:
        """Whether the caller is still there to read the answer that hands the sandbox out, told to the node: one
        nobody is left to hold ends (node/answers.py)."""
        taken = not await hung_up(request)
        await node.answered(tenant, info.id, taken, request.headers.get(ATTEMPT_HEADER) if cluster else None)
        if not taken:
            throttled(log, logging.INFO, "a claim's caller hung up before its answer (sandbox %s)", info.id)

    if cluster:
        @add("POST", "/v1/withdrawals", body=WithdrawRequest, status=204)
        async def withdraw(tenant: str, body: WithdrawRequest) -> Response:
            """A router, or its edge, dropped the answers of these claim attempts after all (node/answers.py)."""
            await node.withdraw(body.attempts)
            return no_content()

    @add("GET", "/v1/sandboxes/{sandbox_id}", answer=SandboxInfo)
    async def get_sandbox(tenant: str, sandbox_id: str) -> Response:
        """Describes one sandbox."""
        return json_response(await node.get(tenant, sandbox_id))

    @add("DELETE", "/v1/sandboxes/{sandbox_id}", status=204)
    async def delete_sandbox(tenant: str, sandbox_id: str) -> Response:
        """Deletes a sandbox (its container goes in the background)."""
        await node.delete(tenant, sandbox_id)
        metrics.activity.commands.drop(sandbox_id)
        return no_content()

    @add("GET", "/v1/sandboxes/{sandbox_id}/stats", answer=SandboxStats)
    async def sandbox_stats(tenant: str, sandbox_id: str) -> Response:
        """What the sandbox uses now: memory and its peak, CPU seconds, processes, disk."""
        return json_response(await node.stats(tenant, sandbox_id))

    @add("GET", "/v1/sandboxes/{sandbox_id}/model_calls", answer=ModelCallLog, query=(Query("offset", int, 0),))
    async def model_calls(tenant: str, sandbox_id: str, offset: int = 0) -> Response:
        """The calls the sandbox's agent made through its model gateway, from `offset` on (docs/gateway.md)."""
        return json_response(await node.model_calls(tenant, sandbox_id, offset))

    @add("POST", "/v1/sandboxes/{sandbox_id}/reset", answer=SandboxInfo)
    async def reset_sandbox(tenant: str, sandbox_id: str) -> Response:
        """Puts the sandbox back to its template or snapshot; the id stays."""
        return json_response(await node.reset(tenant, sandbox_id))

    @add("POST", "/v1/sandboxes/{sandbox_id}/fork", body=ForkRequest, answer=list[SandboxInfo])
    async def fork_sandbox(tenant: str, sandbox_id: str, body: ForkRequest) -> Response:
        """Makes `count` new sandboxes with this one's files."""
        return json_response(await node.fork(tenant, sandbox_id, body.count))

    @add("POST", "/v1/sandboxes/{sandbox_id}/pause", answer=SandboxInfo, query=(Query("memory", bool, True),))
    async def pause_sandbox(tenant: str, sandbox_id: str, memory: bool) -> Response:
        """Freezes the sandbox's processes until it is resumed; `memory=false` keeps its files alone (it starts
        afresh over them when resumed)."""
        return json_response(await node.pause(tenant, sandbox_id, memory))

    @add("POST", "/v1/sandboxes/{sandbox_id}/resume", answer=SandboxInfo)
    async def resume_sandbox(tenant: str, sandbox_id: str) -> Response:
        """Thaws a paused sandbox."""
        return json_response(await node.resume(tenant, sandbox_id))

    @add("PUT", "/v1/sandboxes/{sandbox_id}/network", body=Network, answer=SandboxInfo)
    async def set_network(tenant: str, sandbox_id: str, body: Network) -> Response:
        """Sets the sandbox's egress, within its template's: fewer destinations, ports or protocols, or none."""
        return json_response(await node.set_network(tenant, sandbox_id, body))

    @add("PUT", "/v1/sandboxes/{sandbox_id}/shutdown_after", body=ShutdownAfterRequest, answer=SandboxInfo)
    async def set_shutdown_after(tenant: str, sandbox_id: str, body: ShutdownAfterRequest) -> Response:
        """Deletes the sandbox `shutdown_after` seconds from now."""
        return json_response(await node.set_shutdown_after(tenant, sandbox_id, body.shutdown_after))

    # -- commands ---------------------------------------------------------------------------

    @add("POST", "/v1/sandboxes/{sandbox_id}/exec", body=ExecRequest, answer=ExecResult)
    async def exec_command(tenant: str, sandbox_id: str, body: ExecRequest) -> Response:
        """Runs a command and answers when it ends."""
        metrics.execs.inc()
        started = time.perf_counter()
        result = await node.exec(tenant, sandbox_id, body)
        metrics.record_exec(tenant, sandbox_id, body.command, result.exit_code, time.perf_counter() - started)
        answer = json_response(result)
        answer.headers[EXIT_CODE_HEADER] = "" if result.exit_code is None else str(result.exit_code)
        return answer

    @add("POST", "/v1/sandboxes/{sandbox_id}/exec/stream", body=ExecRequest, answer="application/x-ndjson")
    async def exec_stream(tenant: str, sandbox_id: str, body: ExecRequest) -> Response:
        """Runs a command, streaming {"type": "stdout"|"stderr", "data"} lines, then {"type": "result"}."""
        metrics.execs.inc()

        async def produce(emit: Emit) -> None:
            started = time.perf_counter()
            result = await node.exec(tenant, sandbox_id, body, lambda data: emit({"type": "stdout", "data": data}),
                                     lambda data: emit({"type": "stderr", "data": data}))
            metrics.record_exec(tenant, sandbox_id, body.command, result.exit_code, time.perf_counter() - started)
            emit({"type": "result", "result": result.model_dump()})

        return await ndjson(produce, _exec_error)

    # -- files ------------------------------------------------------------------------------

    @add("GET", "/v1/sandboxes/{sandbox_id}/files", answer="application/octet-stream", query=(PATH,))
    async def read_file(tenant: str, sandbox_id: str, path: str) -> Response:
        """Reads a file's bytes."""
        return Response(await node.files(tenant, sandbox_id, "read", path), media_type="application/octet-stream")

    @add("PUT", "/v1/sandboxes/{sandbox_id}/files", body=bytes, status=204,
         query=(PATH, Query("mode", int, 0o644), Query("metadata", str, "")))
    async def write_file(tenant: str, sandbox_id: str, path: str, mode: int, metadata: str, body: bytes) -> Response:
        """Writes a file (parents are created); `metadata`, a JSON object of strings, becomes its user extended
        attributes."""
        options = {"metadata": file_metadata(metadata)} if metadata else {}
        await node.files(tenant, sandbox_id, "write", path, data=body, mode=mode, **options)
        return no_content()

    @add("DELETE", "/v1/sandboxes/{sandbox_id}/files", status=204, query=(PATH, Query("recursive", bool, False)))
    async def remove_file(tenant: str, sandbox_id: str, path: str, recursive: bool) -> Response:
        """Removes a file, or a directory with recursive=true."""
        await node.files(tenant, sandbox_id, "remove", path, recursive=recursive)
        return no_content()

    @add("GET", "/v1/sandboxes/{sandbox_id}/files/list", answer=list[FileInfo], query=(Query("path", str, "."),))
    async def list_files(tenant: str, sandbox_id: str, path: str) -> Response:
        """Lists a directory."""
        return json_response(await node.files(tenant, sandbox_id, "list", path))

    @add("GET", "/v1/sandboxes/{sandbox_id}/files/stat", answer=FileInfo, query=(PATH,))
    async def stat_file(tenant: str, sandbox_id: str, path: str) -> Response:
        """Describes a file (404 file_not_found if absent)."""
        return json_response(await node.files(tenant, sandbox_id, "stat", path))

    @add("POST", "/v1/sandboxes/{sandbox_id}/files/mkdir", status=204, query=(PATH,))
    async def make_directory(tenant: str, sandbox_id: str, path: str) -> Response:
        """Creates a directory and its parents."""
        await node.files(tenant, sandbox_id, "mkdir", path)
        return no_content()

    @add("GET", "/v1/sandboxes/{sandbox_id}/files/archive", answer="application/x-tar", query=(PATH,))
    async def download_archive(tenant: str, sandbox_id: str, path: str) -> Response:
        """A tar archive of a directory or file."""
        return Response(await node.files(tenant, sandbox_id, "download_tar", path), media_type="application/x-tar")

    @add("PUT", "/v1/sandboxes/{sandbox_id}/files/archive", body=bytes, answer=ArchiveResult, query=(PATH,))
    async def upload_archive(tenant: str, sandbox_id: str, path: str, body: bytes) -> Response:
        """Unpacks a tar archive into a directory."""
        entries = await node.files(tenant, sandbox_id, "upload_tar", path, archive=body)
        return json_response(ArchiveResult(entries=entries))

    # -- snapshots --------------------------------------------------------------------------

    @add("POST", "/v1/sandboxes/{sandbox_id}/snapshot", body=SnapshotRequest, answer=SnapshotInfo)
    async def snapshot_sandbox(tenant: str, sandbox_id: str, body: SnapshotRequest) -> Response:
        """Saves the sandbox's files under a name new sandboxes can start from."""
        return json_response(await node.snapshot(tenant, sandbox_id, body.name))

    @add("GET", "/v1/snapshots", answer=list[SnapshotInfo])
    async def list_snapshots(tenant: str) -> Response:
        """Lists the tenant's snapshots."""
        return json_response(await node.snapshots(tenant))

    @add("DELETE", "/v1/snapshots/{name}", status=204)
    async def delete_snapshot(tenant: str, name: str) -> Response:
        """Deletes a snapshot; sandboxes started from it keep their files."""
        await node.delete_snapshot(tenant, name)
        return no_content()


def file_metadata(text: str) -> dict[str, str]:
    """A write's metadata: a JSON object of strings, each key a name an extended attribute may take."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidRequest("metadata: give a JSON object of strings, such as {\"author\": \"me\"}")
    for key in value:
        if not key or len(key.encode()) > MAX_METADATA_KEY or "\0" in key:
            raise InvalidRequest(f"metadata key {key!r}: give 1 to {MAX_METADATA_KEY} bytes, no NUL")
    return value


def _exec_error(error: RollboxError) -> dict[str, Any]:
    return {"type": "error", "code": error.code, "message": str(error)}
