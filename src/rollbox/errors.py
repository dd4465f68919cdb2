"""One exception hierarchy for every layer, so the SDK raises the same types the engine does.

Each error has a stable `code` (sent over HTTP) and an HTTP `status`, and its message says what
the caller can do about it.
"""

from __future__ import annotations


class RollboxError(Exception):
    code = "internal"
    status = 500


class InvalidRequest(RollboxError):
    code = "invalid_request"
    status = 400


class InvalidResource(InvalidRequest):
    code = "invalid_resource"


class InvalidPath(InvalidRequest):
    """A path that is malformed or would leave the sandbox root."""

    code = "invalid_path"


class Unauthorized(RollboxError):
    code = "unauthorized"
    status = 401


class Forbidden(RollboxError):
    """A known tenant asking for what only the server's admins may do."""

    code = "forbidden"
    status = 403


class NotFound(RollboxError):
    code = "not_found"
    status = 404


class SandboxNotFound(NotFound):
    code = "sandbox_not_found"


class TemplateNotFound(NotFound):
    code = "template_not_found"


class SnapshotNotFound(NotFound):
    code = "snapshot_not_found"


class FileNotFound(NotFound):
    code = "file_not_found"


class Conflict(RollboxError):
    code = "conflict"
    status = 409


class SandboxNotRunning(Conflict):
    code = "sandbox_not_running"


class TooLarge(RollboxError):
    code = "too_large"
    status = 413


class CapacityExceeded(RollboxError):
    """The node or the tenant has no room for another sandbox right now."""

    code = "capacity_exceeded"
    status = 429


class BuildFailed(RollboxError):
    """A template step failed; the message carries its output and exit code."""

    code = "build_failed"
    status = 422

    def __init__(self, message: str, exit_code: int | None = None, output: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.output = output


class RuntimeUnavailable(RollboxError):
    code = "runtime_unavailable"
    status = 503


class NodeUnavailable(RollboxError):
    code = "node_unavailable"
    status = 503


ALL: dict[str, type[RollboxError]] = {}


def _register(cls: type[RollboxError]) -> None:
    ALL[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(RollboxError)


def from_code(code: str, message: str) -> RollboxError:
    """Rebuilds a typed error from its wire code (used by the SDK)."""
    return ALL.get(code, RollboxError)(message)
