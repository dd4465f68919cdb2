"""A SandboxFusion-compatible gateway: `POST /run_code` and `GET /v1/ping` over rollbox sandboxes.

Trainers that already speak SandboxFusion (verl's sandbox_fusion reward, the `sandbox-fusion`
client) point at this app unchanged. No request sees what another wrote or started: by default each
runs as an isolated command (a throw-away copy of a sandbox the gateway holds, docs/engine.md) in one
of a few shared sandboxes (`isolation="isolated"`); `isolation="fresh"` gives every request a new
sandbox, at the cost of a container start and stop per request. It reaches the router through the
SDK, so it runs next to the server (`app.mount("/fusion", fusion_app(client))`, then the endpoint
is `http://router/fusion`) or on its own (`rollbox fusion --url ROUTER`, see `serve_fusion`), where on
TCP it answers only under a secret path, `http://127.0.0.1:8081/<key>`: its clients send no token.
Not supported: languages other than python and bash, `memory_limit_MB` (the template's limits
apply), and compile steps.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import posixpath
import shlex
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollbox._problems import problems
from rollbox._signals import exit_on_sigterm
from rollbox.client import AsyncSandbox, AsyncSandboxClient
from rollbox.errors import RollboxError
from rollbox.server.capability import SecretPath, new_key
from rollbox.server.listen import listen_tcp, listening, run_app

RUN_DIR = "/tmp"
"""Where a request's code and files go, and its working directory: its own in either isolation."""
LANGUAGES = {"python": ("main.py", "python3 main.py"), "bash": ("main.sh", "bash main.sh")}
"""Language -> (file the code is written to, command that runs it)."""
RUNS_PER_SANDBOX = 8
"""Isolated requests one shared sandbox runs at once (its CPU, memory and process limits are theirs)."""


class RunCodeRequest(BaseModel):
    """SandboxFusion's request; unknown fields (memory_limit_MB, ...) are accepted and ignored."""

    code: str
    language: str
    compile_timeout: float = 10
    run_timeout: float = 10
    stdin: str | None = None
    files: dict[str, str | None] = {}
    """Path -> base64 content, written next to the code before it runs."""
    fetch_files: list[str] = []
    """Paths read back after the run, returned base64-encoded."""


class CommandRunResult(BaseModel):
    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


class Lease:
    """A sandbox a request runs in, and whether the run must be isolated from the sandbox."""

    def __init__(self, sandbox: AsyncSandbox, isolated: bool) -> None:
        self.sandbox = sandbox
        self.isolated = isolated
        self.running = 0


class FreshSandboxes:
    """Every request claims its own sandbox from the warm pool and deletes it afterwards: one container
    per request, and the engine's create and delete on every request."""

    def __init__(self, client: AsyncSandboxClient, template: str, warmpool: str | None) -> None:
        self.client, self.template, self.warmpool = client, template, warmpool

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Lease]:
        sandbox = await self.client.create_sandbox(template=self.template, warmpool=self.warmpool)
        try:
            yield Lease(sandbox, isolated=False)
        finally:
            await _delete(sandbox)

    async def release(self) -> None:
        """Nothing to give back: every request deletes its own sandbox."""


class SharedSandboxes(FreshSandboxes):
    """A few claimed sandboxes, each running up to RUNS_PER_SANDBOX requests at once as isolated commands,
    so requests share nothing; a sandbox that fails a request is deleted and replaced."""

    def __init__(self, client: AsyncSandboxClient, template: str, warmpool: str | None) -> None:
        super().__init__(client, template, warmpool)
        self._leases: list[Lease] = []
        self._claiming = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Lease]:
        lease = await self._least_busy()
        lease.running += 1
        try:
            yield lease
        except RollboxError:
            if lease in self._leases:
                self._leases.remove(lease)
                await _delete(lease.sandbox)
            raise
        finally:
            lease.running -= 1

    async def release(self) -> None:
        """Deletes the sandboxes it holds, when the gateway stops: none outlives it."""
        leases, self._leases = self._leases, []
        await asyncio.gather(*(_delete(lease.sandbox) for lease in leases))

    async def _least_busy(self) -> Lease:
        """The sandbox running the fewest requests, claiming one more when all are full (one claim at a time,
        so that a burst of requests does not claim a sandbox each)."""
        if lease := self._with_room():
            return lease
        async with self._claiming:
            if lease := self._with_room():
                return lease
            lease = Lease(await self.client.create_sandbox(template=self.template, warmpool=self.warmpool),
                          isolated=True)
            self._leases.append(lease)
            return lease

    def _with_room(self) -> Lease | None:
        lease = min(self._leases, key=lambda held: held.running, default=None)
        return lease if lease is not None and lease.running < RUNS_PER_SANDBOX else None


def fusion_app(client: AsyncSandboxClient, *, template: str = "rl-python", warmpool: str | None = "rl-python",
               isolation: Literal["isolated", "fresh"] = "isolated") -> Starlette:
    """The gateway's ASGI app; `template`/`warmpool` name where sandboxes come from, `isolation` how
    requests are kept apart (see `SharedSandboxes` and `FreshSandboxes`)."""
    lender = SharedSandboxes(client, template, warmpool) if isolation == "isolated" else \
        FreshSandboxes(client, template, warmpool)

    async def ping(_: Request) -> JSONResponse:
        return JSONResponse("pong")

    async def run_code(request: Request) -> JSONResponse:
        try:
            body = RunCodeRequest.model_validate_json(await request.body())
        except ValidationError as error:
            return JSONResponse({"detail": problems(error, "request")}, status_code=422)
        if body.language not in LANGUAGES:
            message = f"language {body.language!r} is not supported here: use one of {', '.join(LANGUAGES)}"
            response = RunCodeResponse(status="SandboxError", message=message)
        else:
            try:
                async with lender.lease() as lease:
                    response = await _run(lease, body)
            except RollboxError as error:
                response = RunCodeResponse(status="SandboxError", message=str(error))
        return JSONResponse(response.model_dump())

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await lender.release()

    return Starlette(routes=[Route("/v1/ping", ping, methods=["GET"]), Route("/run_code", run_code, methods=["POST"])],
                     lifespan=lifespan)


async def _delete(sandbox: AsyncSandbox) -> None:
    """Deletes a sandbox the gateway is done with; one already gone (expired, deleted by its tenant) is fine."""
    with contextlib.suppress(RollboxError):
        await sandbox.delete()


async def _run(lease: Lease, body: RunCodeRequest) -> RunCodeResponse:
    """One exec: a shell script on stdin writes the code, files and stdin, runs the program, then prints
    the files to fetch after a marker line, so a request's files never exist outside its own run."""
    name, command = LANGUAGES[body.language]
    marker = f"--rollbox-fetch-{uuid.uuid4().hex}--"
    result = await lease.sandbox.commands.run(["/bin/sh", "-s"], timeout=body.run_timeout,
                                              stdin=_script(body, name, command, marker), isolated=lease.isolated)
    stdout, _, fetched = result.stdout.partition(f"\n{marker}\n")
    files = dict(line.split(" ", 1) for line in fetched.splitlines() if " " in line)
    run = CommandRunResult(status="TimeLimitExceeded" if result.timed_out else "Finished",
                           execution_time=result.duration_ms / 1000, return_code=result.exit_code,
                           stdout=stdout, stderr=result.stderr)
    return RunCodeResponse(status="Success" if result.ok else "Failed", run_result=run,
                           files={_unquote(path): content for path, content in files.items()},
                           executor_pod_name=lease.sandbox.id)


def _script(body: RunCodeRequest, name: str, command: str, marker: str) -> str:
    """Shell builtins do the writing (text inline, bytes through base64), so a request that fetches nothing
    costs one shell and its program."""
    def write(path: str, content: str | bytes) -> str:
        target = shlex.quote(path)
        make = f"mkdir -p {shlex.quote(posixpath.dirname(path))} && " if posixpath.dirname(path) else ""
        if isinstance(content, str) and "\0" not in content:
            return f"{make}printf %s {shlex.quote(content)} > {target}\n"
        raw = content.encode() if isinstance(content, str) else content
        return f"{make}printf %s {base64.b64encode(raw).decode()} | base64 -d > {target}\n"

    lines = [f"cd {RUN_DIR} || exit 126\n", write(name, body.code)]
    lines += [write(path, base64.b64decode(content or "")) for path, content in body.files.items()]
    stdin = "</dev/null"
    if body.stdin is not None:
        lines.append(write(".stdin", body.stdin))
        stdin = "<.stdin"
    if not body.fetch_files:
        return "".join(lines) + f"exec {command} {stdin}\n"
    lines.append(f"{command} {stdin}\ncode=$?\nprintf '\\n%s\\n' {marker}\n")
    for path in body.fetch_files:
        quoted = shlex.quote(path)
        lines.append(f"if [ -f {quoted} ]; then printf '%s ' {shlex.quote(_quote(path))}; base64 -w0 {quoted}; "
                     "echo; fi\n")
    return "".join(lines) + "exit $code\n"


def _quote(path: str) -> str:
    """A fetched file's name on its line of the listing: base64, so spaces and newlines survive."""
    return base64.b64encode(path.encode()).decode()


def _unquote(quoted: str) -> str:
    return base64.b64decode(quoted).decode()


def serve_fusion(client: AsyncSandboxClient, *, template: str = "rl-python", warmpool: str | None = "rl-python",
                 isolation: Literal["isolated", "fresh"] = "isolated", host: str = "127.0.0.1", port: int = 8081,
                 key: str | None = None, socket: Path | None = None) -> None:
    """Serves the gateway on its own until SIGINT/SIGTERM, then deletes the sandboxes it claimed.

    On `socket` (0600: its user only) when given; else on `host`:`port` under the secret path `key` (a random one
    when None), printing the endpoint once it listens."""
    app: Any = fusion_app(client, template=template, warmpool=warmpool, isolation=isolation)
    tcp = socket is None
    key = key or (new_key() if tcp else None)
    if key is not None:
        app = SecretPath(app, key)
    exit_on_sigterm()
    with contextlib.closing(listen_tcp(host, port)) if tcp else listening(socket) as listener:
        if tcp:  # listening already: the port printed is the one taken (port 0 takes a free one)
            shown = f"[{host}]" if ":" in host else host
            print(f"SandboxFusion endpoint: http://{shown}:{listener.getsockname()[1]}/{key} (a secret: whoever "
                  "has it runs code with this gateway's router token)", flush=True)
        run_app(app, host, port, listener, "warning")
