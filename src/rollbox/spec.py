"""The declarative resources: `SandboxTemplate`, `SandboxWarmPool` and `SandboxClaim`.

They are Kubernetes-shaped (`apiVersion`, `kind`, `metadata.name`, `spec`) so that the same YAML
reads naturally next to agent-sandbox manifests. Every layer shares these models.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rollbox._problems import problems
from rollbox.errors import InvalidResource
from rollbox.spec_agent_sandbox import Refusals, Refused, parse_all, to_rollbox
from rollbox.spec_network_policy import Policy
from rollbox.units import Bytes, Cores, Seconds

API_VERSION = "rollbox.dev/v1alpha1"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$")
_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Metadata(Model):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _dns_name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError("must be lowercase letters, digits, '-' or '.', at most 63 characters")
        return name


class Limits(Model):
    """Resource limits of one sandbox. Every field has a safe default."""

    cpu: Cores = 1.0
    memory: Bytes = 512 * 2**20
    pids: int = Field(256, gt=0)
    disk: Bytes = 1 * 2**30
    output: Bytes = 1 * 2**20
    shutdown_after: Seconds | None = None
    """Seconds (or `10m`, `1h`) after which the engine deletes each container of the template."""
    upload: Bytes = 64 * 2**20


class CopyStep(Model):
    src: str
    """Relative to the template's context directory (the YAML file's directory)."""
    dest: str
    owner: str | None = None
    """User (name or uid[:gid]) owning the copied files; the template's user when not given."""

    @field_validator("dest")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError("must be an absolute path")
        return path


class Step(Model):
    """One build step; exactly one of its fields is set."""

    run: str | None = None
    copy_: CopyStep | None = Field(None, alias="copy")
    env: dict[str, str] | None = None
    workdir: str | None = None
    user: str | None = None

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        if path is not None and not path.startswith("/"):
            raise ValueError("must be an absolute path")
        return path

    def model_post_init(self, _: Any) -> None:
        given = [name for name in ("run", "copy_", "env", "workdir", "user") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("a step has exactly one of: run, copy, env, workdir, user")

    @property
    def kind(self) -> str:
        return next(name for name in ("run", "copy_", "env", "workdir", "user")
                    if getattr(self, name) is not None).rstrip("_")


class Egress(Model):
    """One destination a sandbox may reach: an IPv4 address or CIDR, or a hostname that the host
    resolves when the sandbox is created; every port and protocol unless `ports`/`protocol` say less."""

    cidr: str | None = None
    host: str | None = None
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(default_factory=list)
    protocol: Literal["tcp", "udp", "any"] = "any"

    @field_validator("cidr")
    @classmethod
    def _ipv4_network(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            network = ipaddress.ip_network(value.strip())
        except ValueError as error:
            raise ValueError(f"{error}: give an IPv4 address (10.1.2.3) or network (10.1.2.0/24)") from None
        if network.version != 4:
            raise ValueError("sandboxes have no IPv6: give an IPv4 address or network")
        if network.subnet_of(_LOOPBACK):  # type: ignore[arg-type]
            raise ValueError("loopback is always the sandbox's own; the host's loopback is never reachable")
        return str(network)

    @field_validator("host")
    @classmethod
    def _hostname(cls, value: str | None) -> str | None:
        if value is not None and not _HOSTNAME.match(value.lower().rstrip(".")):
            raise ValueError(f"{value!r} is not a hostname such as pypi.org")
        return value.lower().rstrip(".") if value is not None else None

    def model_post_init(self, _: Any) -> None:
        if (self.cidr is None) == (self.host is None):
            raise ValueError("an egress entry has exactly one of: cidr, host")


def _egress_shorthand(value: Any) -> Any:
    """A bare string is a whole destination: `10.1.2.3`, `10.1.2.0/24` or `pypi.org`."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    numeric = "/" in text or ":" in text or text.replace(".", "").isdigit()
    return {"cidr": text} if numeric else {"host": text}


class Network(Model):
    """Network policy. `none` (the default) gives a loopback-only network namespace; `allowlist` adds
    one interface through which the host forwards only to the `egress` destinations (docs/engine.md)."""

    mode: Literal["none", "allowlist"] = "none"
    egress: list[Annotated[Egress, BeforeValidator(_egress_shorthand)]] = Field(default_factory=list)

    def model_post_init(self, _: Any) -> None:
        if self.mode == "none" and self.egress:
            raise ValueError("egress needs mode: allowlist")
        if self.mode == "allowlist" and not self.egress:
            raise ValueError("mode allowlist needs at least one egress entry (mode none allows nothing)")


# -- volumes (docs/volumes.md) ---------------------------------------------------------------------

VOLUME_RESERVED = ("/proc", "/sys", "/dev", "/.rollbox")
"""Where no volume may be mounted: the kernel's views and the exec agent's own files."""


class VolumeMount(Model):
    """A named volume mounted into a sandbox: declared on a template (`spec.volumes`) or a claim (`volumes`).

    `size` creates the volume on first use when it does not exist yet; without it a missing volume is an error.
    """

    name: str
    mount_path: str = Field(alias="mountPath")
    read_only: bool = Field(False, alias="readOnly")
    size: Bytes | None = None

    @field_validator("name")
    @classmethod
    def _volume_name(cls, name: str) -> str:
        return volume_name(name)

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, path: str) -> str:
        parts = path.split("/")
        if (not path.startswith("/") or path == "/" or len(path) > 1024 or "\0" in path
                or any(part in ("", ".", "..") for part in parts[1:])):
            raise ValueError(f"{path!r} must be an absolute, normalised path other than / (no '.', '..' or '//')")
        if any(path == reserved or path.startswith(reserved + "/") for reserved in VOLUME_RESERVED):
            raise ValueError(f"{path!r} is reserved: a volume cannot be mounted under {', '.join(VOLUME_RESERVED)}")
        return path


def volume_name(name: str) -> str:
    """A volume's name is a DNS label like every other name: it can never be a path."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"volume name {name!r}: use lowercase letters, digits, '-' or '.', at most 63 characters")
    if name.strip(".") != name or ".." in name:
        raise ValueError(f"volume name {name!r}: no leading, trailing or repeated '.'")
    return name


class ModelGateway(Model):
    """A sandbox's route to the policy model (docs/gateway.md): an OpenAI-compatible address inside the sandbox
    that forwards to `upstream`, records every call, and refuses calls past the budgets (per claim; unset: none).
    On a template it is every claim's default; a claim's own `model_gateway` replaces it whole."""

    upstream: str = Field(pattern=r"^https?://[^/\s]+(/\S*)?$")
    """The trainer's OpenAI-compatible inference server: its base URL, such as `http://10.0.0.5:8000/v1`."""
    api_key: str | None = Field(None, alias="apiKey")
    """Sent to `upstream`; the sandbox never sees it."""
    model: str | None = None
    """Replaces the `model` of every request, so that the agent can only call the policy."""
    max_requests: int | None = Field(None, alias="maxRequests", ge=1)
    max_tokens: int | None = Field(None, alias="maxTokens", ge=1)
    """Prompt and completion tokens together, as the upstream counts them (`usage`)."""
    max_seconds: float | None = Field(None, alias="maxSeconds", gt=0)
    """From the claim on: later calls are refused, and a call still running then is cut."""
class Machine(Model):
    """What a deterministic sandbox's commands are told they run on, whatever the host is (docs/determinism.md)."""

    kernel: str = Field("6.1.0-rollbox", pattern=r"^[A-Za-z0-9._+~-]{1,64}$")
    """The kernel release `uname -r` shows."""
    cpus: int | None = Field(None, ge=1, le=1024)
    """The processors `nproc` and /proc/cpuinfo show; the CPU limit, rounded up, when not given."""
    memory: Bytes | None = None
    """The memory `free` and /proc/meminfo show; the memory limit when not given."""


class TemplateSpec(Model):
    base: str = "host"
    steps: list[Step] = Field(default_factory=list)
    dockerfile: str | None = None
    """A Dockerfile to build instead of `base` and `steps` (docs/dockerfile.md), relative to the YAML's directory."""
    context: str | None = None
    """The Dockerfile's build context, relative to the YAML's directory; the Dockerfile's directory by default."""
    build_args: dict[str, str] = Field(default_factory=dict, alias="buildArgs")
    target: str | None = None
    """The Dockerfile's stage to build (its last by default)."""
    runtime: str = "runc"
    limits: Limits = Field(default_factory=Limits)
    network: Network = Field(default_factory=Network)
    user: str = "user"
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    volumes: list[VolumeMount] = Field(default_factory=list)
    """Mounted into every sandbox claimed from the template (a claim's own volumes come on top)."""
    model_gateway: ModelGateway | None = Field(None, alias="modelGateway")
    deterministic: bool = False
    """Every sandbox runs in deterministic mode (docs/determinism.md), on seed 0 unless its claim gives one."""
    machine: Machine = Field(default_factory=Machine)
    """What a deterministic sandbox says it runs on."""

    @field_validator("base")
    @classmethod
    def _known_base(cls, base: str) -> str:
        if base == "host" or base.split(":", 1)[0] in ("debian", "oci", "oci-archive", "docker-archive", "docker"):
            return base
        if "/" in base.split("@", 1)[0]:
            return f"docker://{base}"  # a registry image named without its scheme
        raise ValueError("base must be 'host', 'debian:<suite>', 'docker://<registry>/<repository>:<tag>' (or "
                         "@sha256:<digest>), 'oci:<dir>[:tag]', 'oci-archive:<file>' or 'docker-archive:<file>'")

    @model_validator(mode="after")
    def _dockerfile_alone(self) -> TemplateSpec:
        if self.dockerfile is None:
            if self.context is not None or self.build_args or self.target is not None:
                raise ValueError("context, buildArgs and target go with a dockerfile")
        elif self.base != "host" or self.steps:
            raise ValueError("a template with a dockerfile takes its base and steps from the Dockerfile: "
                             "drop base and steps (or put them in the Dockerfile as FROM and RUN, COPY...)")
        return self


class SandboxTemplate(Model):
    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: Literal["SandboxTemplate"] = "SandboxTemplate"
    metadata: Metadata
    spec: TemplateSpec = Field(default_factory=TemplateSpec)
    context_dir: str | None = Field(None, exclude=True)
    """Where `copy` sources are read from: the directory of the YAML file, unless given. With a Dockerfile, where
    the build context is: `spec.context` (or the Dockerfile's directory) under that directory."""
    context_root: str | None = Field(None, exclude=True)
    """The build context itself, once it came unpacked with a request: what COPY reads, whatever `context` says."""
    dockerfile_text: str | None = Field(None, exclude=True)
    """The Dockerfile's text, once read where the template was loaded (it travels with the request)."""


class TemplateRef(Model):
    name: str


class WarmPoolSpec(Model):
    replicas: int = Field(ge=0)
    max_replicas: int | None = Field(None, alias="maxReplicas", ge=0)
    sandbox_template_ref: TemplateRef | None = Field(None, alias="sandboxTemplateRef")
    image: str | None = None
    """A registry image whose sandboxes the pool keeps ready, instead of a template (one node; docs/images.md)."""
    refill_concurrency: int = Field(2, alias="refillConcurrency", ge=1)

    @model_validator(mode="after")
    def _template_or_image(self) -> WarmPoolSpec:
        if self.sandbox_template_ref is None and self.image is None:
            raise ValueError("a warm pool names a template (sandboxTemplateRef) or a registry image (image)")
        return self

    @model_validator(mode="after")
    def _max_covers_replicas(self) -> WarmPoolSpec:
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(f"maxReplicas ({self.max_replicas}) is below replicas ({self.replicas}): "
                             "it is how far the pool may grow past replicas")
        return self


class SandboxWarmPool(Model):
    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: Literal["SandboxWarmPool"] = "SandboxWarmPool"
    metadata: Metadata
    spec: WarmPoolSpec


Resource = SandboxTemplate | SandboxWarmPool
_KINDS: dict[str, type[Model]] = {"SandboxTemplate": SandboxTemplate, "SandboxWarmPool": SandboxWarmPool}


def parse_resource(document: dict[str, Any], context_dir: str | None = None, policies: list[Policy] | None = None,
                   refusals: Refusals | None = None) -> Resource:
    """Validates one YAML document; errors name the field and what is wrong with it. `policies`: the NetworkPolicies
    of its file; `refusals`: where agent-sandbox's documents note theirs (else they raise)."""
    before = len(refusals.found) if refusals is not None else 0
    document = to_rollbox(document, policies, refusals)  # agent-sandbox's own SandboxTemplate and SandboxWarmPool
    if refusals is not None and len(refusals.found) > before:
        raise Refused()
    if not isinstance(document, dict):
        raise InvalidResource("a resource must be a mapping with apiVersion, kind, metadata and spec")
    kind = document.get("kind")
    model = _KINDS.get(str(kind))
    if model is None:
        raise InvalidResource(f"kind: {kind!r} is not one of {', '.join(_KINDS)}")
    try:
        resource = model.model_validate(document)
    except ValidationError as error:
        name = (document.get("metadata") or {}).get("name", "?") if isinstance(document.get("metadata"), dict) else "?"
        raise InvalidResource(f"{kind} {name}: {problems(error, '(document)')}") from None
    if isinstance(resource, SandboxTemplate) and resource.context_dir is None:
        resource.context_dir = context_dir
    return resource  # type: ignore[return-value]


def load_resources(text: str, context_dir: str | None = None) -> list[Resource]:
    """Parses a multi-document YAML string into resources, checking every document: what any of them cannot be is
    told at once, each refusal with what to do (agent-sandbox's NetworkPolicies are folded into the templates whose
    pods they select)."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise InvalidResource(f"not valid YAML: {error}") from None
    return parse_all(documents, lambda document, policies, refusals: parse_resource(document, context_dir, policies,
                                                                                   refusals))


def load_file(path: str | Path) -> list[Resource]:
    path = Path(path)
    return load_resources(path.read_text(), context_dir=str(path.parent.resolve()))


def dump(resources: Iterable[Resource]) -> str:
    return yaml.safe_dump_all([r.model_dump(by_alias=True, exclude_none=True) for r in resources],
                              sort_keys=False)
