"""Harbor's `BaseEnvironment` on rollbox: `harbor run --env rollbox.rl.adapters.harbor:RollboxEnvironment` runs each
trial in a rollbox sandbox, as `--env docker` runs it in a container (docs/harbor.md).

The task's `environment/Dockerfile` (or its `docker_image`) is built by rollbox's Dockerfile builds, once for all
the trials whose environments are the same; each trial claims its own sandbox of that template with the task's
cpus, memory and storage as limits; commands run as Docker runs them (`bash -c`, the image's user, root when the
Dockerfile names none); files and directories move through the files API; teardown deletes the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import COMPOSE_FILE_NAME, DOCKERFILE_NAME, require_agent_environment_definition
from harbor.environments.options import EnvironmentOptions
from harbor.models.trial.config import ResourceMode
from pydantic import Field

from rollbox import errors
from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.client.aio import AsyncSandbox
from rollbox.models import ApplyEvent
from rollbox.rl.adapters.harbor import templates
from rollbox.rl.adapters.harbor.account import Account

BASH = ("/bin/bash", "/usr/bin/bash")


class RollboxOptions(EnvironmentOptions):
    """`--ek key=value` options. The router's token is read from ROLLBOX_TOKEN, never from an option: Harbor
    writes options into the job's config.json."""

    url: str | None = Field(None, description="The rollbox router (default: ROLLBOX_URL).")
    runtime: Literal["runc", "runsc"] = Field("runc", description="runc, or gVisor's runsc (no allowlists).")
    image_user: str | None = Field(None, description="The user commands run as when Harbor names none; by default "
                                   "the Dockerfile's USER, else root (as Docker).")
    shutdown_after: float | None = Field(None, description="Seconds after which rollbox deletes a trial's sandbox "
                                         "whatever happens to the Harbor process that claimed it (none by default).")
    nameservers: list[str] = Field(default_factory=list, description="Resolvers the sandbox may reach and uses "
                                   "(written to /etc/resolv.conf) when its network is not no-network.")


class RollboxEnvironment(BaseEnvironment):
    options_model = RollboxOptions
    options: RollboxOptions

    _builds: ClassVar[dict[tuple[int, str, str], asyncio.Future[bool]]] = {}
    """Builds under way or done in this process, by (event loop, router, template): a template is built once,
    whichever trial gets to it first, and the others wait for that build."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: AsyncSandboxClient | None = None
        self._sandbox: AsyncSandbox | None = None
        self._shell: tuple[str, ...] = ()
        self.account = Account()

    @staticmethod
    def type() -> str:
        return "rollbox"

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, network_allowlist=True,
                                       network_allowlist_hostnames=True, network_allowlist_ipv4_addresses=True,
                                       network_allowlist_ipv4_cidrs=True)

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        """Before any trial is queued: the options are valid and the router answers its health check."""
        options = cls.parse_options(kwargs)
        with SandboxClient(options.url if isinstance(options, RollboxOptions) else None) as client:
            try:
                client.health()
            except errors.RollboxError as error:
                raise SystemExit(f"rollbox does not answer at {client.base_url}: {error}") from None

    def _validate_definition(self) -> None:
        dockerfile = self.environment_dir / DOCKERFILE_NAME
        compose = self.environment_dir / COMPOSE_FILE_NAME
        if compose.exists() and not dockerfile.exists() and not self.task_env_config.docker_image:
            raise ValueError(f"{compose}: rollbox runs one container per trial, not a Docker Compose project: "
                             f"give the task an {DOCKERFILE_NAME} or a docker_image")
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    # -- start and stop ------------------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        started = time.monotonic()
        self._client = AsyncSandboxClient(self.options.url)
        with self.account.timing("build_s"):
            template = await self._template(force_build)
        with self.account.timing("claim_s"):
            self._sandbox = await self._client.create_sandbox(
                template=template, limits=self._limits() or None, shutdown_after=self.options.shutdown_after,
                labels={"harbor.trial": self.session_id, "harbor.task": self.environment_name})
        self.account.sandbox = self._sandbox.id
        self.logger.debug(f"rollbox sandbox {self._sandbox.id} of template {template}")
        for bash in BASH:
            if await self._sandbox.files.exists(bash):
                self._shell = (bash, "-c")
                break
        if self.options.nameservers and not self._network_disabled:
            resolv = "".join(f"nameserver {server}\n" for server in self.options.nameservers)
            await self._sandbox.files.write("/etc/resolv.conf", resolv, mode=0o644)
        workdir = self.task_env_config.workdir
        if workdir:  # Docker makes a container's working directory when its image lacks it
            await self._sandbox.commands.run(["mkdir", "-p", workdir], cwd="/", user="root")
        await self._upload_environment_dir_after_start()
        made = await self.ensure_dirs(self._mount_targets(writable_only=True))
        if made is not None and made.return_code != 0:
            raise RuntimeError(f"could not make Harbor's directories in the sandbox: {made.stderr or made.stdout}")
        self.account.start_s = time.monotonic() - started

    async def stop(self, delete: bool) -> None:
        """Deletes the sandbox (`--no-delete` keeps it, for `rollbox exec`), and writes the trial's account."""
        try:
            with self.account.timing("stop_s"):
                if self._sandbox is not None and delete:
                    with contextlib.suppress(errors.SandboxNotFound):
                        await self._sandbox.delete()
                elif self._sandbox is not None:
                    self.logger.info(f"rollbox sandbox {self._sandbox.id} kept: `rollbox delete sandbox "
                                     f"{self._sandbox.id}` removes it")
        finally:
            self._sandbox = None
            if self._client is not None:
                await self._client.close()
                self._client = None
            with contextlib.suppress(OSError):
                self.account.write(self.trial_paths.trial_dir)

    def _limits(self) -> dict[str, Any]:
        cpu = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        storage = self._effective_storage_mb
        limits: dict[str, Any] = {}
        if cpu is not None:
            limits["cpu"] = cpu
        if memory is not None:
            limits["memory"] = memory * 2**20
        if storage is not None:
            limits["disk"] = storage * 2**20
        return limits

    # -- the template ------------------------------------------------------------------------------------------

    async def _template(self, force_build: bool) -> str:
        """The template of this trial's environment, built by the first trial that needs it (`force_build`: built
        again once in this process, whether or not the router has it)."""
        dockerfile = self.environment_dir / DOCKERFILE_NAME
        text = dockerfile.read_text() if dockerfile.is_file() else f"FROM {self.task_env_config.docker_image}\n"
        user = self.options.image_user or (None if templates.sets_user(text) else "root")
        network = templates.network(self.network_policy.network_mode.value, self.network_policy.allowed_hosts,
                                    self.options.nameservers)
        spec = templates.template_spec(network, user, self.options.runtime)
        name = templates.template_name(self.environment_id, spec)
        self.account.template = name
        key = (id(asyncio.get_running_loop()), self._client_now().base_url, name)
        build = self._builds.get(key)
        first = build is None
        if build is None:
            build = self._builds[key] = asyncio.ensure_future(self._build(name, spec, text, force_build))
            build.add_done_callback(lambda done: _forget_failed(self._builds, key, done))
        # Shielded: a trial cancelled while it waits (its timeout) leaves the build to the others.
        built = await asyncio.shield(build)
        self.account.built = first and built
        return name

    async def _build(self, name: str, spec: dict[str, Any], text: str, force_build: bool) -> bool:
        """Applies the template unless the router has it already; returns whether it built."""
        async with AsyncSandboxClient(self._client_now().base_url) as client:
            if not force_build:
                with contextlib.suppress(errors.TemplateNotFound):
                    await client.get_template(name)
                    return False
            with tempfile.TemporaryDirectory(prefix="rollbox-harbor-") as scratch:
                dockerfile = self.environment_dir / DOCKERFILE_NAME
                if not dockerfile.is_file():  # a docker_image task: that image as it is
                    dockerfile = Path(scratch) / DOCKERFILE_NAME
                    dockerfile.write_text(text)
                context = dockerfile.parent
                self.logger.info(f"building {name} from {dockerfile}")
                await client.apply(templates.template_document(name, spec, dockerfile, context), self._progress)
        return True

    def _progress(self, event: ApplyEvent) -> None:
        self.logger.debug(f"rollbox build: {event.model_dump_json(exclude_none=True)}")

    # -- commands and files ------------------------------------------------------------------------------------

    def _client_now(self) -> AsyncSandboxClient:
        if self._client is None:
            raise RuntimeError("the environment has no rollbox client: start it first")
        return self._client

    def _running(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("the rollbox sandbox is not running: start the environment first")
        return self._sandbox

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        """Runs `command` under bash (sh where the image has no bash), as `docker exec` would: in `cwd`, else the
        task's workdir, else the image's; as `user`, else Harbor's default user, else the image's."""
        sandbox = self._running()
        user = self._resolve_user(user)
        started = time.monotonic()
        result = await sandbox.commands.run([*self._shell, command] if self._shell else command,
                                            cwd=cwd or self.task_env_config.workdir, env=self._merge_env(env),
                                            timeout=timeout_sec, user=None if user is None else str(user))
        self.account.exec_calls += 1
        self.account.exec_s += time.monotonic() - started
        self.account.command_s += result.duration_ms / 1000
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        code = result.exit_code if result.exit_code is not None else 128 + result.signal
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copies a local file in, keeping its mode bits (a script stays executable)."""
        source = Path(source_path)
        with self.account.timing("upload_s"):
            await self._running().files.write(target_path, source.read_bytes(),
                                              mode=stat.S_IMODE(source.stat().st_mode))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copies a local directory's contents into `target_dir` (made if missing), modes and links kept."""
        with self.account.timing("upload_s"):
            await self._running().files.upload_dir(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        with self.account.timing("download_s"):
            data = await self._running().files.read(source_path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copies `source_dir`'s contents into `target_dir`, over what is there. What comes out of a sandbox is the
        agent's: a symlink in it that leads out of the directory (`/etc/passwd`, `../../..`) is dropped, so that
        nothing Harbor reads or uploads from the trial's directory can be a file of this machine."""
        with self.account.timing("download_s"), tempfile.TemporaryDirectory(prefix="rollbox-harbor-") as scratch:
            await self._running().files.download_dir(source_dir, scratch)
            for link in _drop_links_out(Path(scratch)):
                self.logger.warning(f"not copied from the sandbox: {source_dir}/{link}, a link out of the directory")
            shutil.copytree(scratch, target_dir, symlinks=True, dirs_exist_ok=True)


def _forget_failed(builds: dict[Any, asyncio.Future[bool]], key: Any, done: asyncio.Future[bool]) -> None:
    """A build that failed is tried again by the next trial that needs it (Harbor's retries among them)."""
    if done.cancelled() or done.exception() is not None:
        builds.pop(key, None)


def _drop_links_out(root: Path) -> list[Path]:
    """Removes the symlinks under `root` that resolve (as this machine would follow them) outside it, until none
    does; returns them, relative to `root`."""
    inside, dropped = root.resolve(), []
    while True:
        out = [path for path in root.rglob("*") if path.is_symlink() and not path.resolve().is_relative_to(inside)]
        if not out:
            return dropped
        for path in out:
            path.unlink()
            dropped.append(path.relative_to(root))
