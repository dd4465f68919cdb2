"""A NeMo Gym `SandboxProvider` whose sandboxes are rollbox sandboxes.

    # a NeMo Gym provider config (the provider is found by its entry point, `rollbox`)
    sandbox:
      rollbox: {url: "http://router:8080", template: rl-python, warmpool: rl-python}

    sandbox = AsyncSandbox({"rollbox": {"url": url, "template": "rl-python"}}, SandboxSpec(workdir="/work"))
    await sandbox.start()
    await sandbox.exec("python -m pytest -q")
    descriptor = await sandbox.serialize()      # JSON: another process calls AsyncSandbox.connect(descriptor, ...)

A handle holds nothing but the sandbox's id and working directory, so it pickles, and any process whose
provider reaches the same router (with a token of the same tenant) can use it: `connect` rebuilds it from
`serialize_handle`'s descriptor. `SandboxSpec.image` names a rollbox template (the provider's `template` is
the default), `ttl_s` is the claim's `shutdown_after`, `env` the claim's environment and `metadata` its
labels; `provider_options` may give `warmpool`, `snapshot`, `idle_pause_after` and `volumes`. Limits
(`resources`) come from the template.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)

from rollbox import errors
from rollbox.client import AsyncSandboxClient
from rollbox.client.aio import AsyncCommands, AsyncFiles

LOGGER = logging.getLogger(__name__)
RUNTIME_RETURN_CODE = 125
"""NeMo Gym's return code for a command the sandbox could not finish (here: it timed out)."""
CLAIM_OPTIONS = frozenset({"warmpool", "snapshot", "idle_pause_after", "volumes"})
STATUSES = {"running": SandboxStatus.RUNNING, "paused": SandboxStatus.PAUSED, "stopped": SandboxStatus.STOPPED}


class RollboxProvider:
    """Creates, drives and deletes rollbox sandboxes for NeMo Gym's `AsyncSandbox` and `Sandbox`."""

    name = "rollbox"

    def __init__(self, url: str | None = None, token: str | None = None, template: str | None = None,
                 warmpool: str | None = None, default_timeout_s: float = 180.0) -> None:
        """`url` and `token` default to ROLLBOX_URL and ROLLBOX_TOKEN."""
        self._client = AsyncSandboxClient(url, token)
        self._template = template
        self._warmpool = warmpool
        self._default_timeout_s = default_timeout_s

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        unknown = set(spec.provider_options) - CLAIM_OPTIONS
        if unknown:
            raise ValueError(f"unknown provider_options {sorted(unknown)} for rollbox: give {sorted(CLAIM_OPTIONS)}")
        if spec.ports:
            raise ValueError("rollbox sandboxes have no declared ports: traffic reaches a port through the router")
        if spec.resources != SandboxResources():
            LOGGER.warning("rollbox takes a sandbox's limits from its template: ignoring resources %s", spec.resources)
        claim = {"warmpool": self._warmpool, **spec.provider_options, "template": spec.image or self._template,
                 "env": dict(spec.env) or None, "labels": dict(spec.metadata) or None,
                 "shutdown_after": spec.ttl_s}
        try:
            async with asyncio.timeout(spec.ready_timeout_s):
                sandbox = await self._client.create_sandbox(**claim)
        except (TimeoutError, errors.RollboxError) as error:
            raise SandboxCreateError(f"rollbox could not create the sandbox: {error}") from error
        handle = SandboxHandle(sandbox_id=sandbox.id, provider_name=self.name,
                               raw={"workdir": spec.workdir})
        if spec.workdir:
            await sandbox.files.mkdir(spec.workdir)
        return handle

    async def exec(self, handle: SandboxHandle, command: str, *, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_s: int | float | None = None,
                   user: str | int | None = None) -> SandboxExecResult:
        timeout = timeout_s if timeout_s is not None else self._default_timeout_s
        commands = AsyncCommands(self._client, self._id(handle))
        result = await commands.run(command, cwd=cwd or handle.raw.get("workdir"), env=env, timeout=timeout,
                                    user=None if user is None else str(user))
        if result.timed_out:
            return SandboxExecResult(stdout=result.stdout, stderr=f"command timed out after {timeout:g}s",
                                     return_code=RUNTIME_RETURN_CODE, error_type="timeout")
        return SandboxExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code or 0)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        data = await asyncio.to_thread(Path(source_path).read_bytes)
        await self._files(handle).write(self._path(handle, target_path), data)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        data = await self._files(handle).read(self._path(handle, source_path))
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(target.write_bytes, data)

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        try:
            sandbox = await self._client.get_sandbox(self._id(handle))
        except errors.SandboxNotFound:
            return SandboxStatus.STOPPED
        return STATUSES.get(sandbox.info.state, SandboxStatus.UNKNOWN)

    async def close(self, handle: SandboxHandle) -> None:
        with contextlib.suppress(errors.SandboxNotFound):
            await self._client.delete_sandbox(handle.sandbox_id)

    async def aclose(self) -> None:
        await self._client.close()

    # -- optional capabilities: pause and resume, handles across processes ---------------------

    async def pause(self, handle: SandboxHandle) -> None:
        await (await self._client.get_sandbox(self._id(handle))).pause()

    async def resume(self, handle: SandboxHandle) -> None:
        await (await self._client.get_sandbox(self._id(handle))).resume()

    async def serialize_handle(self, handle: SandboxHandle, *, scope: str | None = None) -> dict[str, Any]:
        """What `connect` needs: the sandbox's id and working directory (never a token)."""
        return {"provider": self.name, "sandbox_id": handle.sandbox_id, "workdir": handle.raw.get("workdir")}

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle:
        """A handle on a sandbox another process created; fails if this provider's tenant cannot see it."""
        if descriptor.get("provider", self.name) != self.name or "sandbox_id" not in descriptor:
            raise ValueError(f"not a rollbox sandbox descriptor: {dict(descriptor)!r}")
        sandbox = await self._client.get_sandbox(str(descriptor["sandbox_id"]))
        return SandboxHandle(sandbox_id=sandbox.id, provider_name=self.name,
                             raw={"workdir": descriptor.get("workdir")})

    def _id(self, handle: SandboxHandle) -> str:
        if handle.provider_name != self.name:
            raise ValueError(f"handle {handle.sandbox_id!r} belongs to provider {handle.provider_name!r}")
        return handle.sandbox_id

    def _files(self, handle: SandboxHandle) -> AsyncFiles:
        return AsyncFiles(self._client, self._id(handle))

    @staticmethod
    def _path(handle: SandboxHandle, path: str) -> str:
        """A relative path is relative to the spec's working directory, as NeMo Gym's providers take it."""
        workdir = handle.raw.get("workdir")
        return posixpath.join(workdir, path) if workdir and not posixpath.isabs(path) else path
