"""`LocalNode`'s file operations: the engine's, on the sandbox's own files, and `/proc` read through the sandbox.

The files API works on the sandbox's root filesystem from the host, where `/proc` is an empty directory: the
kernel's view of the sandbox (its processes, its limits, `/proc/sys/...`) exists only inside it. So a read under
`/proc` runs `cat` in the sandbox as its user, and answers what the sandbox itself would read; `/proc` takes no
writes through the files API.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from anyio import to_thread

from rollbox.errors import FileNotFound, InvalidRequest
from rollbox.node.base import FileOp

if TYPE_CHECKING:
    from rollbox.engine import Engine
    from rollbox.node.held import HeldClaims

FILE_OPS = frozenset(FileOp.__args__)  # type: ignore[attr-defined]
PROC = "/proc"
PROC_READ_TIMEOUT = 10.0


class FileOperations:
    engine: Engine
    held: HeldClaims

    async def files(self, tenant: str, sandbox_id: str, op: FileOp, path: str, **options: Any) -> Any:
        if op not in FILE_OPS:
            raise InvalidRequest(f"{op!r} is not a file operation: use one of {', '.join(sorted(FILE_OPS))}")
        claim = self.held.get(tenant, sandbox_id)
        if isinstance(path, str) and _under_proc(path):
            return await self._proc(tenant, sandbox_id, op, posixpath.normpath(path))

        def run() -> Any:
            with self.held.using(claim):
                return getattr(self.engine.files(claim.container_id), op)(path, **options)

        return await to_thread.run_sync(run)

    async def _proc(self, tenant: str, sandbox_id: str, op: FileOp, path: str) -> bytes:
        if op != "read":
            raise InvalidRequest(f"{path}: /proc is the sandbox's kernel view: the files API reads it, and nothing "
                                 "else (run a command in the sandbox for the rest)")
        async with self.held.calling(tenant, sandbox_id, "reading /proc") as claim:
            result = await self.engine.exec_async(claim.container_id, ["cat", "--", path], timeout=PROC_READ_TIMEOUT)
        if result.exit_code != 0:
            message = result.stderr.strip() or f"cat exited {result.exit_code}"
            if "No such file" in message:
                raise FileNotFound(f"{path}: no such file or directory")
            raise InvalidRequest(f"{path}: {message}")
        return result.stdout.encode()


def _under_proc(path: str) -> bool:
    absolute = posixpath.normpath(path) if path.startswith("/") else ""
    return absolute == PROC or absolute.startswith(PROC + "/")
