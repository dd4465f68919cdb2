"""SWE-ReX on rollbox: a deployment whose runtime runs every session, command and file in one sandbox.

    deployment = RollboxDeployment(url="http://router:8080", template="rl-python", warmpool="rl-python")
    await deployment.start()                      # claims the sandbox
    runtime = deployment.runtime
    await runtime.create_session(CreateBashSessionRequest())
    await runtime.run_in_session(BashAction(command="cd /tmp && export A=1"))
    await deployment.stop()                       # deletes it

SWE-ReX's own deployments start its server in a container and talk to it over HTTP; here nothing is
installed in the sandbox: a bash session is an interactive bash on a rollbox terminal (`terminal.py`), as
SWE-ReX's own is on pexpect's, and `execute`, files and uploads are the SDK's calls. A command in a session
runs with stdin from /dev/null (SWE-ReX's would wait on the terminal); programs that read the terminal run
with `is_interactive_command`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict
from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    Action,
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionResponse,
    CloseResponse,
    CloseSessionRequest,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    CreateBashSessionResponse,
    IsAliveResponse,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

from rollbox import errors
from rollbox.client import AsyncSandbox, AsyncSandboxClient
from rollbox.rl.adapters.terminal import Ended, Terminal


class RollboxDeploymentConfig(BaseModel):
    """SWE-ReX's config shape for `RollboxDeployment` (its other deployments have one each)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    """The router; ROLLBOX_URL when not given."""
    token: str | None = None
    template: str | None = None
    warmpool: str | None = None
    snapshot: str | None = None
    env: dict[str, str] | None = None
    shutdown_after: float | None = 3600.0
    """Seconds until rollbox deletes the sandbox even if `stop()` never comes."""
    type: Literal["rollbox"] = "rollbox"

    def get_deployment(self) -> RollboxDeployment:
        return RollboxDeployment.from_config(self)


class RollboxDeployment(AbstractDeployment):
    def __init__(self, *, logger: logging.Logger | None = None, **kwargs: Any) -> None:
        """Keyword arguments: those of `RollboxDeploymentConfig`."""
        self._config = RollboxDeploymentConfig(**kwargs)
        self.logger = logger or logging.getLogger("rex-deploy")
        self._hooks = CombinedDeploymentHook()
        self._client: AsyncSandboxClient | None = None
        self._runtime: RollboxRuntime | None = None

    @classmethod
    def from_config(cls, config: RollboxDeploymentConfig) -> Self:
        return cls(**config.model_dump(exclude={"type"}))

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        if self._runtime is None:
            return IsAliveResponse(is_alive=False, message="the deployment was not started")
        return await self._runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        """Claims the sandbox (a warm one when the warm pool has one)."""
        if self._runtime is not None:
            self.logger.warning("the deployment is already started: ignoring start()")
            return
        config = self._config
        self._hooks.on_custom_step("Claiming a rollbox sandbox")
        self._client = AsyncSandboxClient(config.url, config.token)
        sandbox = await self._client.create_sandbox(
            template=config.template, warmpool=config.warmpool, snapshot=config.snapshot, env=config.env,
            shutdown_after=config.shutdown_after)
        self.logger.info("rollbox sandbox %s claimed", sandbox.id)
        self._runtime = RollboxRuntime(sandbox, logger=self.logger)

    async def stop(self) -> None:
        """Closes the sessions and deletes the sandbox."""
        runtime, client = self._runtime, self._client
        self._runtime = self._client = None
        if runtime is not None:
            await runtime.close()
            with contextlib.suppress(errors.SandboxNotFound):  # deleted already, or expired
                await runtime.sandbox.delete()
        if client is not None:
            await client.close()

    @property
    def runtime(self) -> RollboxRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime


class RollboxRuntime(AbstractRuntime):
    """SWE-ReX's runtime contract over one rollbox sandbox (which it does not own: the deployment deletes it)."""

    def __init__(self, sandbox: AsyncSandbox, *, logger: logging.Logger | None = None) -> None:
        self.sandbox = sandbox
        self.logger = logger or logging.getLogger("rex-runtime")
        self._sessions: dict[str, Terminal] = {}
        self._running: dict[str, asyncio.Future[Any]] = {}

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        try:
            async with asyncio.timeout(timeout):
                info = (await self.sandbox.refresh()).info
        except (errors.RollboxError, TimeoutError) as error:
            return IsAliveResponse(is_alive=False, message=f"sandbox {self.sandbox.id}: {error}")
        alive = info.state == "running"
        return IsAliveResponse(is_alive=alive, message="" if alive else f"sandbox {info.id} is {info.state}")

    # -- sessions ---------------------------------------------------------------------------

    async def create_session(self, request: CreateBashSessionRequest) -> CreateBashSessionResponse:
        if request.session in self._sessions:
            raise SessionExistsError(f"session {request.session} already exists")
        startup = [f"source {path}" for path in request.startup_source]
        try:
            terminal, output = await Terminal.open(self.sandbox, startup, max(request.startup_timeout, 5.0))
        except TimeoutError as error:
            raise CommandTimeoutError(f"session {request.session!r} did not start: {error}") from None
        self._sessions[request.session] = terminal
        return CreateBashSessionResponse(output=output)

    async def run_in_session(self, action: Action) -> BashObservation:
        terminal = self._session(action.session)
        if isinstance(action, BashInterruptAction):
            return await self._interrupt(action, terminal)
        if not (action.is_interactive_command or action.is_interactive_quit):
            await asyncio.to_thread(_check_syntax, action.command)
        running = self._running[action.session] = asyncio.ensure_future(self._run(action, terminal))
        try:
            return await running
        finally:
            self._running.pop(action.session, None)

    async def _run(self, action: BashAction, terminal: Terminal) -> BashObservation:
        try:
            if action.is_interactive_command:
                await terminal.send(action.command)
                match = await terminal.expect(action.expect, action.timeout)
                return BashObservation(output=match.string[:match.start()].strip(), exit_code=0,
                                       expect_string=match.group(0))
            if action.is_interactive_quit:
                await terminal.send(action.command)
                output, _ = await terminal.command(":", action.timeout)
                return BashObservation(output=output.strip(), exit_code=0)
            output, exit_code = await terminal.command(action.command, action.timeout)
        except TimeoutError:
            raise CommandTimeoutError(f"timeout after {action.timeout} seconds while running command "
                                      f"{action.command!r}") from None
        except Ended as error:
            self._sessions.pop(action.session, None)
            raise SessionDoesNotExistError(f"session {action.session!r} ended: {error}") from None
        checked = None if action.check == "ignore" else exit_code
        if action.check == "raise" and checked != 0:
            message = f"Command {action.command!r} failed with exit code {checked}. Here is the output:\n{output!r}"
            raise NonZeroExitCodeError(f"{action.error_msg}: {message}" if action.error_msg else message)
        return BashObservation(output=output, exit_code=checked)

    async def _interrupt(self, action: BashInterruptAction, terminal: Terminal) -> BashObservation:
        """Ctrl-C (up to `n_retry` times) until the command that runs, or that timed out, gives its marker."""
        running, nonce = self._running.get(action.session), terminal.pending
        if nonce is None:
            return BashObservation(output="", exit_code=0)
        for _ in range(action.n_retry):
            await terminal.interrupt()
            try:
                if running is not None:
                    observation = await asyncio.wait_for(asyncio.shield(running), action.timeout)
                    return BashObservation(output=observation.output.strip(), exit_code=0)
                output, _ = await terminal.marker(nonce, action.timeout)
                return BashObservation(output=output.strip(), exit_code=0)
            except TimeoutError:
                continue
        raise CommandTimeoutError(f"failed to interrupt session {action.session!r}: its command ignores SIGINT")

    async def close_session(self, request: CloseSessionRequest) -> CloseBashSessionResponse:
        await self._session(request.session).close()
        del self._sessions[request.session]
        return CloseBashSessionResponse()

    def _session(self, name: str) -> Terminal:
        if name not in self._sessions:
            raise SessionDoesNotExistError(f"session {name!r} does not exist")
        return self._sessions[name]

    # -- commands and files -----------------------------------------------------------------

    async def execute(self, command: Command) -> CommandResponse:
        """Like `subprocess.run`: a string with `shell=True` runs under /bin/sh -c, anything else is an argv."""
        argv = command.command if isinstance(command.command, list) else [command.command]
        if command.shell:
            argv = ["/bin/sh", "-c", *argv]
        if command.merge_output_streams:
            argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
        result = await self.sandbox.commands.run(argv, timeout=command.timeout, env=command.env, cwd=command.cwd)
        if result.timed_out:
            raise CommandTimeoutError(f"Timeout ({command.timeout}s) exceeded while running command")
        response = CommandResponse(stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code)
        if command.check and result.exit_code != 0:
            message = f"Command {command.command!r} failed with exit code {result.exit_code}. " \
                      f"Stdout:\n{result.stdout!r}\nStderr:\n{result.stderr!r}"
            raise NonZeroExitCodeError(f"{command.error_msg}: {message}" if command.error_msg else message)
        return response

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        try:
            data = await self.sandbox.files.read(request.path)
        except errors.FileNotFound as error:
            raise FileNotFoundError(str(error)) from None
        return ReadFileResponse(content=data.decode(request.encoding or "utf-8", request.errors or "strict"))

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        await self.sandbox.files.write(request.path, request.content)
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        """Copies a local file or directory into the sandbox (a directory in one request)."""
        source = Path(request.source_path)
        if source.is_dir():
            await self.sandbox.files.upload_dir(source, request.target_path)
        else:
            await self.sandbox.files.write(request.target_path, await asyncio.to_thread(source.read_bytes))
        return UploadResponse()

    async def close(self) -> CloseResponse:
        """Ends every session (the sandbox stays: its deployment deletes it)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for terminal in sessions:
            with contextlib.suppress(errors.NotFound):
                await terminal.close()
        return CloseResponse()


def _check_syntax(command: str) -> None:
    """Refuses what bash cannot parse before it reaches the session, as SWE-ReX's own runtime does."""
    result = subprocess.run(["bash", "-n"], input=command.encode(), capture_output=True, check=False)
    if result.returncode != 0:
        stdout, stderr = (stream.decode(errors="backslashreplace") for stream in (result.stdout, result.stderr))
        raise BashIncorrectSyntaxError(
            f"Error (exit code {result.returncode}) while checking bash command \n{command!r}\n"
            f"---- Stderr ----\n{stderr}\n---- Stdout ----\n{stdout}",
            extra_info={"bash_stdout": stdout, "bash_stderr": stderr})
