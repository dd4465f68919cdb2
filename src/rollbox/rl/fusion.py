"""A SandboxFusion-compatible gateway: `POST /run_code` and `GET /v1/ping` over rollbox sandboxes.

Trainers that already speak SandboxFusion (verl's sandbox_fusion reward, the `sandbox-fusion`
client) point at this app unchanged. Requests never share a sandbox at the same time, and never
see what an earlier request left: by default a sandbox is scrubbed between requests
(`isolation="scrubbed"`); `isolation="fresh"` gives every request a new sandbox, at the cost of a
container start and stop per request. It reaches the router through the
SDK, so it runs next to the server (`app.mount("/fusion", fusion_app(client))`, then the endpoint
is `http://router/fusion`) or on its own (`python -m rollbox.rl.fusion --url ROUTER`).
Not supported: languages other than python and bash, `memory_limit_MB` (the template's limits
apply), and compile steps.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import posixpath
import shlex
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollbox.client import AsyncSandbox, AsyncSandboxClient
from rollbox.errors import RollboxError
from rollbox.rl.validation import describe

RUN_ROOT = "/tmp/fusion"
"""Each request's files go to `<RUN_ROOT>-<random>`."""
LANGUAGES = {"python": ("main.py", "python3 main.py"), "bash": ("main.sh", "bash main.sh")}
"""Language -> (file the code is written to, command that runs it)."""
WRITABLE_DIRS = ("find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type d -writable -print "
                 "-prune 2>/dev/null; if [ -w /dev/shm ]; then echo /dev/shm; fi")
"""Lists the top directories the sandbox user can write (run as that user, once per sandbox)."""


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
    """A sandbox lent to one request, and the shell text that must run before the request's command."""

    def __init__(self, sandbox: AsyncSandbox, writable: Sequence[str] = ()) -> None:
        self.sandbox = sandbox
        self.writable = writable
        self.uses = 0

    def prefix(self, run_dir: str) -> str:
        """Kills what earlier requests left running and empties every directory they could write, but
        `run_dir`; shell builtins do the work, and `rm` runs only when something is left to remove."""
        if not self.writable:
            return ""
        patterns = " ".join(f"{shlex.quote(d)}/{glob}" for d in self.writable for glob in ("*", ".[!.]*", "..?*"))
        return (f"kill -9 -1 2>/dev/null; set --; for f in {patterns}; do "
                f"if [ \"$f\" != {shlex.quote(run_dir)} ] && {{ [ -e \"$f\" ] || [ -L \"$f\" ]; }}; "
                "then set -- \"$@\" \"$f\"; fi; done; if [ $# -gt 0 ]; then rm -rf -- \"$@\"; fi; ")


class FreshSandboxes:
    """Every request claims its own sandbox from the warm pool and deletes it afterwards: one container
    per request, the strongest isolation, and the engine's create and delete on every request."""

    def __init__(self, client: AsyncSandboxClient, template: str, warmpool: str | None) -> None:
        self.client, self.template, self.warmpool = client, template, warmpool

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Lease]:
        sandbox = await self.client.create_sandbox(template=self.template, warmpool=self.warmpool)
        try:
            yield Lease(sandbox)
        finally:
            with contextlib.suppress(RollboxError):
                await sandbox.delete()


class ScrubbedSandboxes(FreshSandboxes):
    """Claimed sandboxes lent to one request at a time. Before each run every process the sandbox user
    left is killed and every directory that user can write is emptied, so a request finds what a
    fresh sandbox holds; a sandbox is replaced after `recycle_after` requests or any sandbox error."""

    def __init__(self, client: AsyncSandboxClient, template: str, warmpool: str | None, recycle_after: int = 100
                 ) -> None:
        super().__init__(client, template, warmpool)
        self.recycle_after = recycle_after
        self._idle: list[Lease] = []

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Lease]:
        lease = self._idle.pop() if self._idle else await self._claim()
        healthy = False
        try:
            yield lease
            healthy = True
        finally:
            lease.uses += 1
            if healthy and lease.uses < self.recycle_after:
                self._idle.append(lease)
            else:
                with contextlib.suppress(RollboxError):
                    await lease.sandbox.delete()

    async def _claim(self) -> Lease:
        sandbox = await self.client.create_sandbox(template=self.template, warmpool=self.warmpool)
        found = await sandbox.commands.run(WRITABLE_DIRS, cwd="/")
        return Lease(sandbox, found.stdout.split())


def fusion_app(client: AsyncSandboxClient, *, template: str = "rl-python", warmpool: str | None = "rl-python",
               isolation: Literal["scrubbed", "fresh"] = "scrubbed") -> Starlette:
    """The gateway's ASGI app; `template`/`warmpool` name where sandboxes come from, `isolation` how
    requests are kept apart (see `ScrubbedSandboxes` and `FreshSandboxes`)."""
    lender = ScrubbedSandboxes(client, template, warmpool) if isolation == "scrubbed" else \
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
    """One exec: scrub, then run. Without stdin for the program, the code travels as the exec's stdin
    (written by `cat`), which saves a request to the router."""
    sandbox = lease.sandbox
    name, command = LANGUAGES[body.language]
    run_dir = f"{RUN_ROOT}-{uuid.uuid4().hex}"
    for path, content in body.files.items():
        await sandbox.files.write(posixpath.join(run_dir, path), base64.b64decode(content or ""))
    if body.stdin is None:
        script = (f"{lease.prefix(run_dir)}mkdir -p {run_dir} && cd {run_dir} && cat > {name} && "
                  f"exec {command} </dev/null")
        stdin = body.code
    else:
        await sandbox.files.write(f"{run_dir}/{name}", body.code)
        script, stdin = f"{lease.prefix(run_dir)}cd {run_dir} && exec {command}", body.stdin
    result = await sandbox.commands.run(["/bin/sh", "-c", script], timeout=body.run_timeout, stdin=stdin)
    fetched = {}
    for path in body.fetch_files:
        with contextlib.suppress(RollboxError):
            fetched[path] = base64.b64encode(await sandbox.files.read(posixpath.join(run_dir, path))).decode()
    run = CommandRunResult(status="TimeLimitExceeded" if result.timed_out else "Finished",
                           execution_time=result.duration_ms / 1000, return_code=result.exit_code,
                           stdout=result.stdout, stderr=result.stderr)
    return RunCodeResponse(status="Success" if result.ok else "Failed", run_result=run, files=fetched,
                           executor_pod_name=sandbox.id)


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m rollbox.rl.fusion", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the rollbox router (env ROLLBOX_URL)")
    parser.add_argument("--token", help="the router's bearer token (env ROLLBOX_TOKEN)")
    parser.add_argument("--template", default="rl-python")
    parser.add_argument("--warmpool", default="rl-python")
    parser.add_argument("--isolation", choices=("scrubbed", "fresh"), default="scrubbed")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args(argv)
    app: Any = fusion_app(AsyncSandboxClient(args.url, args.token), template=args.template, warmpool=args.warmpool,
                          isolation=args.isolation)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
