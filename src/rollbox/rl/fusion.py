"""A SandboxFusion-compatible gateway: `POST /run_code` and `GET /v1/ping` over rollbox sandboxes.

Trainers that already speak SandboxFusion (verl's sandbox_fusion reward, the `sandbox-fusion`
client) point at this app unchanged. Every request runs in a fresh sandbox claimed from a warm
pool and deleted afterwards, so requests never see each other. It reaches the router through the
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
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollbox.client import AsyncSandboxClient
from rollbox.errors import RollboxError
from rollbox.rl.validation import describe

RUN_DIR = "/tmp/fusion"
LANGUAGES = {"python": ("main.py", ["python3", "main.py"]), "bash": ("main.sh", ["bash", "main.sh"])}
"""Language -> (file the code is written to, command that runs it)."""


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


def fusion_app(client: AsyncSandboxClient, *, template: str = "rl-python", warmpool: str | None = "rl-python"
               ) -> Starlette:
    """The gateway's ASGI app; `template`/`warmpool` name what each request's sandbox is claimed from."""

    async def ping(_: Request) -> JSONResponse:
        return JSONResponse("pong")

    async def run_code(request: Request) -> JSONResponse:
        try:
            body = RunCodeRequest.model_validate_json(await request.body())
        except ValidationError as error:
            return JSONResponse({"detail": describe(error, "request")}, status_code=422)
        try:
            response = await _run(client, body, template, warmpool)
        except RollboxError as error:
            response = RunCodeResponse(status="SandboxError", message=str(error))
        return JSONResponse(response.model_dump())

    return Starlette(routes=[Route("/v1/ping", ping, methods=["GET"]), Route("/run_code", run_code, methods=["POST"])])


async def _run(client: AsyncSandboxClient, body: RunCodeRequest, template: str, warmpool: str | None
               ) -> RunCodeResponse:
    if body.language not in LANGUAGES:
        return RunCodeResponse(status="SandboxError", message=f"language {body.language!r} is not supported here: "
                                                              f"use one of {', '.join(LANGUAGES)}")
    name, command = LANGUAGES[body.language]
    sandbox = await client.create_sandbox(template=template, warmpool=warmpool)
    try:
        await sandbox.files.write(f"{RUN_DIR}/{name}", body.code)
        for path, content in body.files.items():
            await sandbox.files.write(posixpath.join(RUN_DIR, path), base64.b64decode(content or ""))
        result = await sandbox.commands.run(command, cwd=RUN_DIR, timeout=body.run_timeout, stdin=body.stdin)
        fetched = {}
        for path in body.fetch_files:
            with contextlib.suppress(RollboxError):
                fetched[path] = base64.b64encode(await sandbox.files.read(posixpath.join(RUN_DIR, path))).decode()
    finally:
        with contextlib.suppress(RollboxError):
            await sandbox.delete()
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
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args(argv)
    app: Any = fusion_app(AsyncSandboxClient(args.url, args.token), template=args.template, warmpool=args.warmpool)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
