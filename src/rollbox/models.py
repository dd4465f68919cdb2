"""Every wire shape, once: requests, answers, stream events and the error body.

The server validates and writes these; the SDK writes and reads the same classes, so the two can
not drift apart. Requests forbid unknown fields (a misspelt one is an error, not ignored); answers
ignore fields they do not know, so an older SDK keeps working against a newer router. Limits that
a request must respect (the fork cap) live on its model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from rollbox.spec import Bytes, ModelGateway, VolumeMount, parse_seconds, volume_name

MAX_FORK = 64
"""The most sandboxes one fork makes."""
MAX_EXEC_TIMEOUT = 365 * 86400.0
"""The longest a command's timeout may be: past any run, within the agent's milliseconds and a socket's timeout."""
MAX_PATH = 4096
"""Characters a working directory has at most: the kernel's PATH_MAX."""

PositiveSeconds = Annotated[float, BeforeValidator(parse_seconds), Field(gt=0)]
SandboxState = Literal["running", "paused", "stopped"]
ApplyStatus = Literal["created", "configured", "unchanged"]


class Request(BaseModel):
    """A request body: a misspelt field is an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


# -- requests -------------------------------------------------------------------------------------

class ClaimRequest(Request):
    """What `POST /v1/sandboxes` asks for: a warm pool, a template or a snapshot to start from."""

    template: str | None = None
    warmpool: str | None = None
    snapshot: str | None = None
    shutdown_after: PositiveSeconds | None = None
    """Seconds (or `10m`, `1h`) until the claim ends and its sandbox is deleted."""
    idle_pause_after: PositiveSeconds | None = None
    """Seconds without calls after which the sandbox is paused."""
    env: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    volumes: list[VolumeMount] | None = None
    """Named volumes to mount (docs/volumes.md), besides the template's; a claim with volumes starts cold."""
    model_gateway: ModelGateway | None = None
    """The sandbox's route to the policy model (docs/gateway.md); the template's when not given."""


class ExecRequest(Request):
    """One command. A string runs under `/bin/sh -c`; a list is the argv."""

    command: str | list[str]
    timeout: float | None = Field(None, gt=0, le=MAX_EXEC_TIMEOUT)
    env: dict[str, str] | None = None
    cwd: str | None = Field(None, max_length=MAX_PATH)
    user: str | None = None
    stdin: str | None = None
    output_limit: int | None = Field(None, gt=0)
    """Bytes of stdout and of stderr kept (the template's limit by default)."""
    isolated: bool = False
    """Run in a throw-away copy of the sandbox: what the command writes and starts is gone when it ends."""


class ForkRequest(Request):
    count: int = Field(ge=1, le=MAX_FORK)


class SnapshotRequest(Request):
    name: str


class ShutdownAfterRequest(Request):
    """Moves a sandbox's end: it is deleted `shutdown_after` seconds from now (E2B's `set_timeout`)."""

    shutdown_after: PositiveSeconds


class ApplyRequest(Request):
    documents: list[dict[str, Any]]
    context_dir: str | None = None
    """The directory `copy` steps read from, on the server's machine (the YAML file's directory)."""


# -- answers --------------------------------------------------------------------------------------

class SandboxInfo(BaseModel):
    """A tenant's sandbox. Its id stays the same across `reset`."""

    id: str
    template: str
    warmpool: str | None = None
    tenant: str
    state: SandboxState
    """A stopped sandbox's container stopped (killed on the host, out of memory): calls fail until `reset`."""
    created_at: float
    expires_at: float | None = None
    idle_pause_after: float | None = None
    snapshot: str | None = None
    parent: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    volumes: list[VolumeMount] = Field(default_factory=list)
    """The volumes mounted in the sandbox (its template's and its claim's)."""
    memory: bool = False
    """A fork's child or a claim from a snapshot: whether it started with the processes and memory of its
    parent or snapshot (gVisor), or with their files alone."""


class ExecResult(BaseModel):
    exit_code: int | None
    """None when the command timed out."""
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    signal: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class FileInfo(BaseModel):
    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    target: str | None = None
    """Where a symlink points (as written, never resolved)."""


class ArchiveResult(BaseModel):
    entries: int


class SandboxStats(BaseModel):
    memory_bytes: int
    memory_peak_bytes: int
    cpu_seconds: float
    pids: int
    disk_bytes: int
    cost: ClaimCost | None = None
    """What the claim has used since it began (None from a server that does not account claims)."""


# -- cost accounting (docs/observability.md) ---------------------------------------------------


class ClaimCost(BaseModel):
    """What a claim has used from its start to now, across resets: the figures a rollout is priced by.

    CPU-seconds come from the cgroups' CPU counters; memory and disk GB-seconds integrate samples of the
    cgroup's memory and of the sandbox's own writes over time (docs/observability.md says how often)."""

    cpu_seconds: float = 0.0
    memory_gb_seconds: float = 0.0
    disk_gb_seconds: float = 0.0
    wall_seconds: float = 0.0
    memory_peak_bytes: int = 0
    disk_peak_bytes: int = 0
    samples: int = 0
    """Memory samples taken so far; each GB-second figure is a trapezoid sum over them."""


class SnapshotInfo(BaseModel):
    name: str
    template: str
    created_at: float
    source: str | None = None
    memory: bool = False
    """Whether it keeps the sandbox's processes and memory (gVisor), so that a claim from it runs on where it was
    taken; else its files alone."""
    size: int | None = None
    """Bytes it holds on disk of its own: the files the sandbox wrote and its checkpoint image."""


class TemplateInfo(BaseModel):
    name: str
    spec: dict[str, Any]
    built_at: float


class WarmPoolInfo(BaseModel):
    name: str
    template: str
    replicas: int
    max_replicas: int | None = None
    target: int
    """Ready sandboxes it keeps now: `replicas`, raised towards `max_replicas` by recent bursts of claims."""
    ready: int
    starting: int
    labels: dict[str, str] = Field(default_factory=dict)
    refill_concurrency: int = 2


class Health(BaseModel):
    """`GET /healthz`: needs no token."""

    status: str
    node: str | None = None
    """The node's name, when it is a node agent of a cluster."""
    nodes: dict[str, Any] | None = None
    """A cluster's router: each node's name and state."""
    sandboxes: int = 0
    max_sandboxes: int | None = None
    """The most sandboxes the node runs (claimed, warm and starting); None from a server that does not say."""
    claims: int = 0
    pools: dict[str, Any] = Field(default_factory=dict)
    data_plane: str | None = None
    """A cluster's router: who forwards commands and file calls to their nodes, "nginx" or "python"
    (docs/cluster.md)."""


# -- volumes (docs/volumes.md) ---------------------------------------------------------------------

class VolumeRequest(Request):
    """What `POST /v1/volumes` asks for: a named volume of `size` bytes (or `1Gi`, `500Mi`)."""

    name: str
    size: Bytes

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return volume_name(name)


class VolumeUse(BaseModel):
    sandbox: str
    read_only: bool


class VolumeInfo(BaseModel):
    """A tenant's volume: its size limit, the bytes its files use, and the sandboxes that mount it now."""

    name: str
    size: int
    used: int
    created_at: float
    mounted_by: list[VolumeUse] = Field(default_factory=list)


# -- stream events --------------------------------------------------------------------------------

class ExecEvent(BaseModel):
    """One line of the exec stream: output as produced, then the result (or an error)."""

    type: Literal["stdout", "stderr", "result", "error"]
    data: str = ""
    result: ExecResult | None = None
    code: str | None = None
    message: str | None = None


class ApplyEvent(BaseModel):
    """One line of the apply stream; which fields are set depends on `event`."""

    event: Literal["progress", "applied", "error", "done"]
    kind: str | None = None
    name: str | None = None
    message: str | None = None
    status: ApplyStatus | None = None
    code: str | None = None


# -- processes: background processes, terminals and shell sessions (docs/processes.md) ------------

MAX_PROCESS_TAG = 256
"""The longest tag a process may carry."""


def _signal_number(value: Any) -> Any:
    """A signal by number or by name (`"SIGTERM"`, `"term"`, `15`)."""
    if isinstance(value, str) and not value.isdigit():
        import signal as signals

        name = value.upper() if value.upper().startswith("SIG") else "SIG" + value.upper()
        found = getattr(signals.Signals, name, None)
        if found is None:
            raise ValueError(f"{value!r} is not a signal: use a number or a name such as SIGTERM")
        return int(found)
    return value


Signal = Annotated[int, BeforeValidator(_signal_number), Field(ge=1, le=64)]


class PtySize(BaseModel):
    """A terminal's size in character cells."""

    rows: int = Field(24, ge=1, le=1000)
    cols: int = Field(80, ge=1, le=1000)


class ProcessRequest(Request):
    """Starts a process that runs in the background: `POST /v1/sandboxes/{sandbox_id}/processes`.

    It keeps running between calls until it ends, is killed, or its sandbox is reset or deleted. Its output
    is kept in the sandbox (the last `output_limit` bytes of stdout and stderr together) to be read back or
    streamed again.
    """

    command: str | list[str]
    """A string runs under `/bin/sh -c`; a list is the argv."""
    env: dict[str, str] | None = None
    cwd: str | None = Field(None, max_length=MAX_PATH)
    user: str | None = None
    stdin: str | None = None
    """Written to the process's stdin as it starts; more can be sent later unless `close_stdin`."""
    close_stdin: bool = False
    """Close stdin after `stdin` (a process that reads it to the end then sees end of file)."""
    pty: PtySize | None = None
    """Run on a terminal of this size instead of pipes: stdout and stderr arrive together as stdout."""
    timeout: float | None = Field(None, gt=0, le=MAX_EXEC_TIMEOUT)
    """Seconds after which the process and everything it started are killed."""
    output_limit: int | None = Field(None, gt=0)
    """Bytes of each stream kept for reading back (the template's output limit by default)."""
    tag: str | None = Field(None, max_length=MAX_PROCESS_TAG)
    """A caller's name for the process, shown in lists."""


class ProcessControl(Request):
    """What `POST .../processes/{process_id}/control` does, in this order: write stdin, close it, resize the
    terminal, send a signal. Each field is optional."""

    stdin: str | None = None
    close_stdin: bool = False
    resize: PtySize | None = None
    signal: Signal | None = None


class ShellRequest(Request):
    """Starts a persistent shell session: `POST /v1/sandboxes/{sandbox_id}/shells`. Its working directory,
    environment and shell variables carry from one command to the next."""

    env: dict[str, str] | None = None
    cwd: str | None = Field(None, max_length=MAX_PATH)
    user: str | None = None
    shell: str | None = None
    """The shell to run: bash when the sandbox has it, else /bin/sh."""


class ShellCommand(Request):
    """One command run in a shell session: `POST /v1/sandboxes/{sandbox_id}/shells/{process_id}/run`."""

    command: str
    timeout: float | None = Field(None, gt=0, le=MAX_EXEC_TIMEOUT)
    """Seconds after which the command is interrupted (then killed); the session lives on."""
    output_limit: int | None = Field(None, gt=0)


class ProcessInfo(BaseModel):
    """A background process of a sandbox (running, or ended and kept to be read back)."""

    id: str
    """The process id rollbox gives it: unique in its sandbox, never reused."""
    pid: int
    """Its pid inside the sandbox."""
    command: list[str]
    cwd: str | None = None
    tag: str | None = None
    pty: bool = False
    shell: bool = False
    """A shell session (run commands in it with `.../shells/{id}/run`)."""
    running: bool = True
    exit_code: int | None = None
    """None while running or when it timed out; 128 + the signal's number when a signal ended it (`signal`)."""
    signal: int = 0
    timed_out: bool = False
    started_at: float = 0.0


class ProcessEvent(BaseModel):
    """One line of a process's event stream (`GET .../processes/{process_id}/events`).

    `start` comes first, with the byte offset its output resumes from; `stdout` and `stderr` carry output,
    each with the offset just past it (stream again from there after a reconnect); `gap` says output was
    dropped (the reader fell behind the kept output) and where it resumes; `end` carries the result (exit
    code, signal, timed_out; its stdout and stderr are empty: they were streamed); `error` ends a stream
    that failed.
    """

    type: Literal["start", "stdout", "stderr", "gap", "end", "error"]
    data: str = ""
    offset: int | None = None
    pid: int | None = None
    result: ExecResult | None = None
    code: str | None = None
    message: str | None = None


# -- the model gateway (docs/gateway.md) ----------------------------------------------------------

class ModelCall(BaseModel):
    """One call an agent made through its sandbox's model gateway, as it was forwarded and answered."""

    index: int
    """Its place among the sandbox's calls, from 0."""
    endpoint: str
    """The OpenAI API path after `/v1/`: `chat/completions`, `responses`, `completions` or `models`."""
    stream: bool = False
    started_at: float
    duration_ms: float = 0.0
    status: int = 0
    """The answer's HTTP status: the upstream's, or the gateway's own (429 past a budget, 502 or 504 when the
    upstream failed or was too slow)."""
    request: dict[str, Any] | None = None
    """The request's JSON as forwarded (the gateway's `model` in place of the agent's, when it sets one)."""
    response: dict[str, Any] | None = None
    """The answer's JSON; for a stream, the answer assembled from its chunks (text, tool calls, usage)."""
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    """The completion's token ids, when the upstream returns them (vLLM's `return_token_ids`)."""
    logprobs: list[float] | None = None
    """The completion's tokens' log-probabilities, when the request asked for them (`logprobs: true`)."""


class ModelCallLog(BaseModel):
    """A sandbox's model calls from `offset` on, and what its budgets have used: `GET .../model_calls`."""

    calls: list[ModelCall] = Field(default_factory=list)
    count: int = 0
    """Calls so far, including those before `offset`."""
    tokens: int = 0
    seconds: float = 0.0
    """Since the gateway opened for the sandbox."""
    open: bool = True
    """False once the sandbox's claim has ended (its key is refused from then on)."""


# -- errors ---------------------------------------------------------------------------------------

class ErrorDetail(BaseModel):
    code: str
    """A `rollbox.errors` class's `code`."""
    message: str


class ErrorBody(BaseModel):
    """Every error answer: `{"error": {"code", "message"}}`, with the status of the code's class."""

    error: ErrorDetail

    @classmethod
    def of(cls, code: str, message: str) -> ErrorBody:
        return cls(error=ErrorDetail(code=code, message=message))
