"""What the SDK's calls accept: the keyword arguments of `create_sandbox` and `commands.run`, and the shapes of a
command, a YAML source and the streaming callbacks. Both clients' signatures use these."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypedDict

from rollbox.models import ApplyEvent, LeaseRef
from rollbox.spec import ModelGateway, Network, VolumeMount

OutputCallback = Callable[[str], None]
ProgressCallback = Callable[[ApplyEvent], None]
Command = str | Sequence[str]
"""A shell string (run under /bin/sh -c) or an argv list."""
Source = str | os.PathLike[str]
"""A YAML file's path, or YAML text (anything with a newline in it)."""


class ClaimOptions(TypedDict, total=False):
    """What `create_sandbox` accepts: a warm pool, a template, an image or a snapshot to start from, and the claim's
    policy."""

    template: str | None
    image: str | None
    """A registry image (`HOST/REPO:TAG` or `...@sha256:...`) to start as it is: no template applied first."""
    limits: dict[str, Any] | None
    """`{"cpu", "memory", "pids", "disk"}`, any of them, for this sandbox alone (the template's otherwise)."""
    warmpool: str | None
    snapshot: str | None
    shutdown_after: float | str | None
    """Seconds (or `10m`, `1h`) until the sandbox is deleted."""
    idle_pause_after: float | str | None
    """Seconds without calls after which the sandbox is paused."""
    env: dict[str, str] | None
    labels: dict[str, str] | None
    volumes: list[VolumeMount | dict[str, Any]] | None
    """Named volumes to mount: `{"name", "mount_path", "read_only"?, "size"?}` each (docs/volumes.md)."""
    model_gateway: ModelGateway | dict[str, Any] | None
    """The sandbox's route to the policy: `{"upstream", "api_key"?, "model"?, "max_requests"?, "max_tokens"?,
    "max_seconds"?}`; its processes get OPENAI_BASE_URL and OPENAI_API_KEY (docs/gateway.md)."""
    seed: int | None
    """Deterministic mode from this seed (docs/determinism.md)."""
    network: Network | dict[str, Any] | None
    """The sandbox's own egress, within its template's: `{"mode": "none"}`, or an allowlist of fewer destinations."""
    on_timeout: Literal["delete", "pause", "pause_files"] | None
    """What `shutdown_after` does when it runs out: delete (the default) or pause the sandbox."""
    request_key: str | None
    """The claim's key (the SDK makes one): sent again with it after a connection error or a 503, it answers the
    sandbox the first attempt made. None: no key, and the claim is not sent again (docs/faults.md)."""
    lease: LeaseRef | dict[str, Any] | None
    """The lease to claim under (`lease.ref`); by default the one the client has open (`client.lease(...)`), if
    any. None: no lease."""


class ExecOptions(TypedDict, total=False):
    """What `commands.run` accepts besides the command."""

    timeout: float | None
    """Seconds before the command's process group is killed; the result then has `timed_out`."""
    env: dict[str, str] | None
    cwd: str | None
    user: str | None
    stdin: str | None
    output_limit: int | None
    """Bytes of stdout and of stderr kept (the template's limit by default)."""
    isolated: bool
    """Run in a throw-away copy of the sandbox: it sees the sandbox's files, but what it writes, the
    processes it starts and its network are its own and gone when it ends (runc templates)."""
    on_stdout: OutputCallback | None
    """Called with each piece of stdout as it is produced (the call then streams)."""
    on_stderr: OutputCallback | None
