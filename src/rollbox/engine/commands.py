"""A command as the exec agent takes it, from the caller's options and the container's record.

The caller names a user, extra environment and a directory; the agent needs numeric ids, the whole
environment and a directory, all of which depend on the container's image and template.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path

from rollbox.engine import accounts
from rollbox.engine.agent_client import AgentRequest
from rollbox.engine.runtimes import Runtime
from rollbox.engine.store import ContainerRecord
from rollbox.errors import InvalidRequest, SandboxNotRunning

BASE_ENV = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC", "HOSTNAME": "sandbox", "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1"}
"""Every command's environment. No bytecode caches: Python validates a .pyc by the source's mtime in
whole seconds and its size, so a same-size fix written in the second a test imported the module would
silently run the old code (and earn the old reward)."""
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def agent_request(record: ContainerRecord, runtime: Runtime, rootfs: Path, command: str | Sequence[str], *,
                  timeout: float | None, env: dict[str, str] | None, cwd: str | None, user: str | None,
                  stdin: bytes | str | None, output_limit: int | None, isolated: bool) -> AgentRequest:
    """The request for one command; `user` is looked up in the container's own /etc under `rootfs`."""
    if record.state == "paused":
        raise SandboxNotRunning("is paused: resume it before running commands", container_id=record.id)
    if isolated and not runtime.isolates_commands:
        raise InvalidRequest(f"{record.runtime} cannot run isolated commands: use a runc template, or run the "
                             "command without isolation")
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    if not argv:
        raise InvalidRequest("the command is empty")
    if user is None:
        identity = (record.uid, record.gid, tuple(record.groups))
        home = record.home
    else:
        account = accounts.resolve([rootfs], user)
        identity, home = (account.uid, account.gid, account.groups), account.home
    full_env = {**BASE_ENV, "PATH": PATH_ENV, "HOME": home, **runtime.exec_env,
                **record.image.env, **record.env, **(env or {})}
    if cwd and not cwd.startswith("/"):
        cwd = posixpath.join(home, cwd)  # as the files API takes relative paths: from the user's home
    return AgentRequest(
        command=argv, env=full_env, cwd=cwd or record.image.workdir or home, user=identity, timeout=timeout,
        output_limit=output_limit or record.limits["output"],
        stdin=stdin.encode() if isinstance(stdin, str) else stdin, isolated=isolated,
    )
