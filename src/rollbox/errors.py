"""Every error rollbox raises, in one tree, so the SDK raises the same types the engine and node do.

Each error has a stable `code` (sent over HTTP as `{"error": {"code", "message"}}`) and the HTTP
`status` it answers with; its message says what the caller can do about it. The SDK rebuilds the
typed error from the code (`from_code`), and falls back on the status for answers that are not
rollbox's own (a proxy's 502). An error about one sandbox (`AboutSandbox`) carries its id as a field:
the engine names the container, and the node retells it about the sandbox that container serves. An error
may also say whether the same call, sent again soon, can succeed (`retry`, sent as
`{"error": {..., "retry": false}}`): the SDK sends a 503 again unless it says it cannot.

    RollboxError (500 internal)
    ├── InvalidRequest (400 invalid_request)
    │   ├── InvalidResource (400 invalid_resource)     a template or warm pool that cannot be
    │   ├── InvalidPath (400 invalid_path)             a path that would leave the sandbox
    │   ├── UnprocessableBody (422 invalid_request)    malformed JSON, a missing or mistyped field
    │   ├── MethodNotAllowed (405 invalid_request)
    │   ├── EditFailed (400 edit_failed)               an RL edit whose text is missing or ambiguous
    │   └── InvalidAction (400 invalid_action)         a policy's output that is no tool call
    ├── Unauthorized (401 unauthorized)
    ├── Forbidden (403 forbidden)                      a tenant asking for what only admins may do
    ├── NotFound (404 not_found)
    │   ├── SandboxNotFound (404 sandbox_not_found)
    │   ├── TemplateNotFound (404 template_not_found)
    │   ├── SnapshotNotFound (404 snapshot_not_found)
    │   ├── VolumeNotFound (404 volume_not_found)
    │   ├── FileNotFound (404 file_not_found)
    │   ├── ImageNotFound (404 image_not_found)        no such image, or the tenant's credentials cannot read it
    │   ├── NoWarmSandbox (404 no_warm_sandbox)        a node agent's warm-only claim it cannot take warm
    │   └── ProcessNotFound (404 process_not_found)    no such background process in the sandbox
    ├── Conflict (409 conflict)
    │   ├── SandboxNotRunning (409 sandbox_not_running)
    │   ├── VolumeInUse (409 volume_in_use)             mounted read-write elsewhere, or mounted at all on delete
    │   └── RestoreFailed (409 restore_failed)          a checkpoint image (processes and memory) that would not load
    ├── TooLarge (413 too_large)
    ├── CapacityExceeded (429 capacity_exceeded)
    ├── BuildFailed (422 build_failed)                 a template step failed
    ├── ImageRefused (422 image_refused)               an image whose bytes do not match its digests, or too large
    ├── ImagePullFailed (502 image_pull_failed)        the registry did not answer, after retries
    ├── PortClosed (502 port_closed)                   nothing listens on the port asked for in the sandbox
    ├── TaskSetupFailed (422 task_setup_failed)        an RL task's own setup failed
    ├── RuntimeUnavailable (503 runtime_unavailable)
    ├── NodeUnavailable (503 node_unavailable)         a node agent that does not answer (yet), or is down
    ├── NodeLost (410 node_lost)                       the sandbox's node left the cluster
    └── ConnectionFailed (503 connection_failed)       the SDK could not reach the router
"""

from __future__ import annotations

from typing import Any, Self

__all__ = [
    "AboutSandbox",
    "BuildFailed",
    "CapacityExceeded",
    "Conflict",
    "ConnectionFailed",
    "EditFailed",
    "FileNotFound",
    "Forbidden",
    "ImageNotFound",
    "ImagePullFailed",
    "ImageRefused",
    "InvalidAction",
    "InvalidPath",
    "InvalidRequest",
    "InvalidResource",
    "MethodNotAllowed",
    "NoWarmSandbox",
    "NodeLost",
    "NodeUnavailable",
    "NotFound",
    "PortClosed",
    "ProcessNotFound",
    "RestoreFailed",
    "RollboxError",
    "RuntimeUnavailable",
    "SandboxNotFound",
    "SandboxNotRunning",
    "SnapshotNotFound",
    "TaskSetupFailed",
    "TemplateNotFound",
    "TooLarge",
    "Unauthorized",
    "UnprocessableBody",
    "VolumeInUse",
    "VolumeNotFound",
    "from_code",
]


class RollboxError(Exception):
    code = "internal"
    status = 500
    retry: bool | None = None
    """Whether the same call sent again soon may succeed; None leaves it to the status (the SDK sends a 503 again).
    False for a node known to be down: its calls answer at once, and waiting would not change the answer."""

    def __init__(self, message: str = "", *, retry: bool | None = None) -> None:
        super().__init__(message)
        if retry is not None:
            self.retry = retry


class InvalidRequest(RollboxError):
    code = "invalid_request"
    status = 400


class InvalidResource(InvalidRequest):
    code = "invalid_resource"


class InvalidPath(InvalidRequest):
    """A path that is malformed or would leave the sandbox root."""

    code = "invalid_path"


class UnprocessableBody(InvalidRequest):
    """Malformed JSON, a missing or mistyped field: 422, as docs/api.md says."""

    status = 422


class MethodNotAllowed(InvalidRequest):
    """A known path asked with a method it does not take."""

    status = 405


class EditFailed(InvalidRequest):
    """The text to replace is missing or ambiguous; the message says which."""

    code = "edit_failed"


class InvalidAction(InvalidRequest):
    """The policy's output is not one of the tools; the episode goes on and the agent sees why."""

    code = "invalid_action"


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


class AboutSandbox(RollboxError):
    """An error about one sandbox, whose message leaves out who it is about: the engine raises it about a
    container (`container_id`), and the node retells it about the sandbox that container serves (`retold`), so
    a tenant never sees a container id. Its text is the one it is about, then the message: `sandbox <id> has
    stopped: ...`."""

    def __init__(self, message: str, *, container_id: str | None = None, sandbox_id: str | None = None,
                 retry: bool | None = None) -> None:
        super().__init__(message, retry=retry)
        self.message = message
        self.container_id = container_id
        self.sandbox_id = sandbox_id

    def __str__(self) -> str:
        if self.sandbox_id is not None:
            return f"sandbox {self.sandbox_id} {self.message}"
        if self.container_id is not None:
            return f"container {self.container_id} {self.message}"
        return self.message

    def retold(self, sandbox_id: str) -> Self:
        """The same error, about the sandbox whose container it was about."""
        return type(self)(self.message, container_id=self.container_id, sandbox_id=sandbox_id, retry=self.retry)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.message,), self.__dict__


class SandboxNotFound(AboutSandbox, NotFound):
    code = "sandbox_not_found"


class TemplateNotFound(NotFound):
    code = "template_not_found"


class SnapshotNotFound(NotFound):
    code = "snapshot_not_found"


class FileNotFound(NotFound):
    code = "file_not_found"


class NoWarmSandbox(NotFound):
    """A node agent's warm-only claim (`warm_only`: its router's edge asks the nodes in turn) that the node cannot
    take from a ready warm sandbox. A 404, which nginx takes as "try the next node" without counting the node as
    failing (docs/cluster.md); the router places what no node takes warm."""

    code = "no_warm_sandbox"


class ProcessNotFound(NotFound):
    code = "process_not_found"


class Conflict(RollboxError):
    code = "conflict"
    status = 409


class SandboxNotRunning(AboutSandbox, Conflict):
    code = "sandbox_not_running"


class VolumeNotFound(NotFound):
    code = "volume_not_found"


class VolumeInUse(Conflict):
    code = "volume_in_use"


class RestoreFailed(Conflict):
    """A checkpoint image (a sandbox's processes and memory) is corrupt or missing: nothing of the restore is left."""

    code = "restore_failed"


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

    def __init__(self, message: str, exit_code: int | None = None, output: str = "", *,
                 retry: bool | None = None) -> None:
        super().__init__(message, retry=retry)
        self.exit_code = exit_code
        self.output = output


class ImageNotFound(NotFound):
    """No such image, or the caller's credentials cannot read it: the two are not told apart, as registries do."""

    code = "image_not_found"


class ImageRefused(RollboxError):
    """An image whose bytes do not match the digests that name them, or past a size cap: nothing of it is kept."""

    code = "image_refused"
    status = 422


class ImagePullFailed(RollboxError):
    """The registry did not answer, or broke off, after retries with backoff: worth trying again later."""

    code = "image_pull_failed"
    status = 502


class PortClosed(RollboxError):
    """Nothing listens on the port asked for, on the sandbox's loopback (or on all its addresses): start the server
    first, or wait for it to listen."""

    code = "port_closed"
    status = 502


class TaskSetupFailed(RollboxError):
    """A task's setup command or edit failed: the task file is wrong, not the agent."""

    code = "task_setup_failed"
    status = 422


class RuntimeUnavailable(RollboxError):
    code = "runtime_unavailable"
    status = 503


class NodeUnavailable(RollboxError):
    """A node agent that does not answer: restarting, or cut off (worth a retry); or down for longer than a restart
    takes (`retry` False: not sent again by the SDK)."""

    code = "node_unavailable"
    status = 503


class NodeLost(RollboxError):
    """The node serving the sandbox left the cluster, and the sandbox with it: claim a new one. Not retried."""

    code = "node_lost"
    status = 410


class ConnectionFailed(RollboxError):
    """The router could not be reached, or stopped answering mid-call."""

    code = "connection_failed"
    status = 503


ALL: dict[str, type[RollboxError]] = {}


def _register(cls: type[RollboxError]) -> None:
    ALL.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _register(sub)


_register(RollboxError)


def from_code(code: str, message: str, retry: bool | None = None) -> RollboxError:
    """Rebuilds a typed error from its wire code (used by the SDK)."""
    return ALL.get(code, RollboxError)(message, retry=retry)
