"""A SandboxFusion-compatible gateway: `POST /run_code` and `GET /v1/ping` over rollbox sandboxes.

Trainers that already speak SandboxFusion (verl's sandbox_fusion reward, the `sandbox-fusion`
client) point at this app unchanged. No request sees what another wrote or started: by default each
runs as an isolated command (a throw-away copy of a sandbox the gateway holds, docs/engine.md) in one
of a few shared sandboxes (`isolation="isolated"`); `isolation="fresh"` gives every request a new
sandbox, at the cost of a container start and stop per request. It reaches the router through the
SDK, so it runs next to the server (`app.mount("/fusion", fusion_app(client))`, then the endpoint
is `http://router/fusion`) or on its own (`python -m rollbox.rl.fusion --url ROUTER`), where on TCP it
answers only under a secret path, `http://127.0.0.1:8081/<key>`: its clients send no token.
Not supported: languages other than python and bash, `memory_limit_MB` (the template's limits
apply), and compile steps.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import posixpath
import shlex
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollbox.client import AsyncSandbox, AsyncSandboxClient
from rollbox.errors import RollboxError
from rollbox.rl.validation import describe
from rollbox.server.capability import SecretPath, new_key

RUN_DIR = "/tmp"
"""Where a request's code and files go, and its working directory: its own in either isolation."""
LANGUAGES = {"python": ("main.py", "python3 main.py"), "bash": ("main.sh", "bash main.sh")}
"""Language -> (file the code is written to, command that runs it)."""
RUNS_PER_SANDBOX = 8
"""Isolated requests one shared sandbox runs at once (its CPU, memory and process limits are theirs)."""
KEY_ENV = "ROLLBOX_FUSION_KEY"
"""The standalone gateway's key (see rollbox.server.capability), kept across restarts so trainers' URLs stay."""


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
            with contextlib.suppress(RollboxError):
                await sandbox.delete()


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
                with contextlib.suppress(RollboxError):
                    await lease.sandbox.delete()
            raise
        finally:
            lease.running -= 1

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
            return JSONResponse({"detail": describe(error, "request")}, status_code=422)
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

    return Starlette(routes=[Route("/v1/ping", ping, methods=["GET"]), Route("/run_code", run_code, methods=["POST"])])


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


def main(argv: Sequence[str] | None = None) -> None:
    from rollbox.server.serve import exit_on_sigterm, listen_tcp, listening, run_app

    parser = argparse.ArgumentParser(prog="python -m rollbox.rl.fusion", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the rollbox router (env ROLLBOX_URL)")
    parser.add_argument("--token", help="the router's bearer token (env ROLLBOX_TOKEN)")
    parser.add_argument("--template", default="rl-python")
    parser.add_argument("--warmpool", default="rl-python")
    parser.add_argument("--isolation", choices=("isolated", "fresh"), default="isolated")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--key", default=os.environ.get(KEY_ENV),
                        help=f"the secret first path segment of the endpoint (env {KEY_ENV}); on TCP a random one "
                             "when not given, printed at start")
    parser.add_argument("--socket", type=Path, metavar="PATH",
                        help="listen on this unix socket (mode 0600: your user only) instead of --host and --port")
    args = parser.parse_args(argv)
    try:
        app: Any = fusion_app(AsyncSandboxClient(args.url, args.token), template=args.template,
                              warmpool=args.warmpool, isolation=args.isolation)
        tcp = args.socket is None
        key = args.key or (new_key() if tcp else None)
        if key is not None:
            app = SecretPath(app, key)
        exit_on_sigterm()
        with contextlib.closing(listen_tcp(args.host, args.port)) if tcp else listening(args.socket) as listener:
            if tcp:  # listening already: the port printed is the one taken (--port 0 takes a free one)
                host = f"[{args.host}]" if ":" in args.host else args.host
                print(f"SandboxFusion endpoint: http://{host}:{listener.getsockname()[1]}/{key} (a secret: whoever "
                      "has it runs code with this gateway's router token)", flush=True)
            run_app(app, args.host, args.port, listener, "warning")
    except RollboxError as error:
        parser.exit(1, f"{parser.prog}: {error}\n")


if __name__ == "__main__":
    main()
