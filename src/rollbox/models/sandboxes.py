"""The wire shapes of sandboxes: claims, commands, files, stats and cost, snapshots, templates and warm pools,
volumes, the exec and apply streams, and the error body (`rollbox.models` has them all).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from rollbox.spec import ModelGateway, Network, VolumeMount, volume_name
from rollbox.units import Bytes, Cores, number_or_unit, parse_seconds

MAX_FORK = 64
"""The most sandboxes one fork makes."""
MAX_EXEC_TIMEOUT = 365 * 86400.0
"""The longest a command's timeout may be: past any run, within the agent's milliseconds and a socket's timeout."""
MAX_PATH = 4096
"""Characters a working directory has at most: the kernel's PATH_MAX."""
KEY = r"^[A-Za-z0-9._~:-]{1,128}$"
"""A request key or a lease id: chosen by the caller, safe in a path and in nginx's configuration."""

PositiveSeconds = Annotated[float, BeforeValidator(parse_seconds), Field(gt=0),
                            number_or_unit({"type": "number", "exclusiveMinimum": 0})]
SandboxState = Literal["running", "paused", "stopped"]
ApplyStatus = Literal["created", "configured", "unchanged"]


class Request(BaseModel):
    """A request body: a misspelt field is an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


# -- requests -------------------------------------------------------------------------------------

class LeaseRef(Request):
    """The lease a claim is made under (docs/faults.md): the caller's id for it, and the seconds it lasts unless
    renewed."""

    id: str = Field(pattern=KEY)
    ttl: PositiveSeconds


class LeaseRequest(Request):
    """`PUT /v1/leases/{id}`: opens or renews a lease for `ttl` seconds from now."""

    ttl: PositiveSeconds


class ClaimLimits(Request):
    """What a claim asks of cpu, memory, processes and disk; what it leaves out is its template's (docs/images.md)."""

    cpu: Cores | None = None
    memory: Bytes | None = None
    pids: int | None = Field(None, gt=0)
    disk: Bytes | None = None


class ClaimRequest(Request):
    """What `POST /v1/sandboxes` asks for: a warm pool, a template, a registry image or a snapshot to start from."""

    template: str | None = None
    image: str | None = Field(None, max_length=1024)
    """A registry image (`HOST/REPO:TAG`, `...@sha256:...`), started as it is: pulled once, cached by digest."""
    limits: ClaimLimits | None = None
    """Limits for this sandbox alone, within the node's caps; a claim with limits starts cold."""
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
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    """Runs the sandbox in deterministic mode from this seed (docs/determinism.md): warm from a template with
    `spec.deterministic`, cold from another."""
    network: Network | None = None
    """Its own network, within its template's (which it may narrow, never widen): fewer destinations, or `none`."""
    on_timeout: Literal["delete", "pause", "pause_files"] | None = None
    """What `shutdown_after` does when it runs out: delete the sandbox (None too), or pause it (`pause_files`:
    keeping its files alone, so it starts afresh over them when resumed). A paused sandbox waits, without an end,
    for a resume or traffic to its ports."""
    request_key: str | None = Field(None, pattern=KEY)
    """The caller's key for this claim: the same key from the same tenant, sent again within ten minutes, answers
    the same sandbox instead of a new one, so a claim whose answer was lost can be sent again (the SDK makes one
    per `create_sandbox`; docs/faults.md)."""
    lease: LeaseRef | None = None
    """The lease it is made under: the sandbox ends when the lease is closed or not renewed in time. A claim with
    neither a lease nor `shutdown_after` gets the node's default `shutdown_after`; `shutdown_after: null`, sent as
    such, asks for none."""


class WithdrawRequest(Request):
    """Claim attempts whose answers their callers dropped (a cluster's router and its edge only; node/answers.py)."""

    attempts: list[Annotated[str, Field(pattern=KEY)]] = Field(max_length=1000)


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


class BuildContext(Request):
    """What a template's build reads, sent with it so that the server may be on another machine."""

    model_config = ConfigDict(extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")
    archive: bytes
    """A gzip'ed tar: a Dockerfile's build context (less what `.dockerignore` leaves out), or the files `copy` steps
    name, under their paths from the YAML's directory."""
    dockerfile: str | None = None
    """The Dockerfile's text, for a template built from one."""


class ApplyRequest(Request):
    documents: list[dict[str, Any]]
    context_dir: str | None = None
    """The directory `copy` steps read from, on the server's machine (the YAML file's directory), for the templates
    `contexts` does not name."""
    contexts: dict[str, BuildContext] = Field(default_factory=dict)
    """Build contexts by template name (the SDK sends one for every template with a Dockerfile or `copy` steps)."""


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
    seed: int | None = None
    """The seed of a deterministic sandbox (a fork's child has one given by its parent's); None for another."""
    template_digest: str | None = None
    """What the sandbox started from: its template's layers, settings and deterministic machine (a trajectory
    records it with the seed)."""
    network: Network | None = None
    """Its own network where its claim (or `set_network`) narrowed its template's; None: the template's."""
    lease: str | None = None
    """The id of the lease it was claimed under (it ends with the lease)."""


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
    owner: str | None = None
    """The owning user's name in the sandbox's /etc/passwd (its number where it has none there)."""
    group: str | None = None
    """The owning group's name in the sandbox's /etc/group (its number where it has none there)."""
    metadata: dict[str, str] | None = None
    """The file's user extended attributes (`user.<key>`), by key; None when it has none."""


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
    config: dict[str, Any] = Field(default_factory=dict)
    """What its Dockerfile said about running it, recorded but not acted on: `entrypoint`, `cmd`, `labels`,
    `exposedPorts`, `volumes`, `stopSignal`, `healthcheck`, `shell` (docs/dockerfile.md)."""


class LeaseInfo(BaseModel):
    """A lease as the nodes holding it see it."""

    id: str
    ttl: float
    expires_at: float | None
    """When it ends unless renewed; None once closed."""
    sandboxes: int
    """Sandboxes claimed under it that still run (on the nodes that answered)."""


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


# -- errors ---------------------------------------------------------------------------------------

class ErrorDetail(BaseModel):
    code: str
    """A `rollbox.errors` class's `code`."""
    message: str
    retry: bool | None = None
    """Whether the same call, sent again soon, may succeed; left out when the status says it (a 503: yes). False
    from a node known to be down."""


class ErrorBody(BaseModel):
    """Every error answer: `{"error": {"code", "message"}}`, with the status of the code's class."""

    error: ErrorDetail

    @classmethod
    def of(cls, code: str, message: str, retry: bool | None = None) -> ErrorBody:
        return cls(error=ErrorDetail(code=code, message=message, retry=retry))

    def dumped(self) -> bytes:
        """As sent: `retry` only when it says something."""
        return self.model_dump_json(exclude_none=True).encode()
