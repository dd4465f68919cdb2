"""E2B's template builds, made rollbox templates: what `Template.build` sends becomes a Dockerfile and a build context.

The SDK uploads each `copy` step's files (a tar, by a hash of what they are) before it starts a build; they are kept
here, per tenant, and unpacked into the build's context. The build itself is a Dockerfile template applied to the
node, so it runs where any template builds (a cluster's nodes too), one cached layer per step. Builds and tags live in
this process (a restarted router forgets them; the templates they made stay).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from rollbox.archives import unpack_context
from rollbox.errors import InvalidRequest, NotFound
from rollbox.server.e2b.api import Body
from rollbox.spec import Metadata, SandboxTemplate

DEFAULT_USER = "user"
DEFAULT_WORKDIR = "/home/user"
MAX_LOG_PAGE = 100
"""Log entries one status call returns at most, as E2B's API does."""
_HASH = re.compile(r"^[0-9a-f]{64}$")
_LINE = re.compile(r"\bline (\d+)\b")
Status = Literal["waiting", "building", "ready", "error"]


class Step(Body):
    type: str
    args: list[str] = Field(default_factory=list)
    files_hash: str | None = Field(None, alias="filesHash")
    force: bool | None = None


class BuildStart(Body):
    """What `POST /v2/templates/{id}/builds/{build}` carries (E2B's TemplateBuildStartV2)."""

    from_image: str | None = Field(None, alias="fromImage")
    from_template: str | None = Field(None, alias="fromTemplate")
    from_image_registry: dict[str, Any] | None = Field(None, alias="fromImageRegistry")
    start_cmd: str | None = Field(None, alias="startCmd")
    ready_cmd: str | None = Field(None, alias="readyCmd")
    steps: list[Step] = Field(default_factory=list)
    force: bool = False


@dataclass
class Build:
    build_id: str
    template: str
    tenant: str
    cpu: int | None = None
    memory_mb: int | None = None
    status: Status = "waiting"
    logs: list[dict[str, Any]] = field(default_factory=list)
    reason: dict[str, Any] | None = None
    steps: dict[int, str] = field(default_factory=dict)
    """The generated Dockerfile's lines, to E2B's step names ("base", "1", "2"...)."""

    def log(self, message: str, level: str = "info") -> None:
        self.logs.append({"timestamp": _now(), "level": level, "message": message})

    def fail(self, message: str) -> None:
        self.status = "error"
        self.log(message, "error")
        line = _LINE.search(message)
        step = self.steps.get(int(line.group(1))) if line else None
        self.reason = {"message": message, **({"step": step} if step else {}), "logEntries": self.logs[-1:]}

    def status_page(self, offset: int, limit: int) -> dict[str, Any]:
        entries = self.logs[offset:offset + min(limit, MAX_LOG_PAGE)]
        return {"templateID": self.template, "buildID": self.build_id, "status": self.status, "logEntries": entries,
                "logs": [entry["message"] for entry in entries],
                **({"reason": self.reason} if self.reason else {})}


@dataclass
class Tag:
    build_id: str
    created_at: str


class Builds:
    """The builds, tags and uploaded files of one router process."""

    def __init__(self) -> None:
        self.builds: dict[str, Build] = {}
        self.tags: dict[str, dict[str, Tag]] = {}
        self._files = Path(tempfile.mkdtemp(prefix="rollbox-e2b-files-"))
        weakref.finalize(self, shutil.rmtree, self._files, True)

    def start(self, tenant: str, name: str, extra_tags: list[str], cpu: int | None, memory_mb: int | None) -> Build:
        template, tags = split_name(name)
        try:
            Metadata(name=template)
        except ValidationError:
            raise InvalidRequest(f"template name {template!r}: rollbox names are lowercase letters, digits, '-' and "
                                 "'.', at most 63 characters") from None
        build = Build(str(uuid.uuid4()), template, tenant, cpu, memory_mb)
        self.builds[build.build_id] = build
        self.tag(template, build.build_id, [*tags, *extra_tags] or ["default"])
        return build

    def get(self, tenant: str, template: str, build_id: str) -> Build:
        build = self.builds.get(build_id)
        if build is None or build.tenant != tenant or build.template != template:
            raise NotFound(f"build {build_id} of template {template} does not exist")
        return build

    def tag(self, template: str, build_id: str, tags: list[str]) -> list[str]:
        for tag in tags:
            if not tag or ":" in tag or "/" in tag:
                raise InvalidRequest(f"tag {tag!r}: give a tag alone (letters, digits, '.', '-', '_')")
        known = self.tags.setdefault(template, {})
        known.update({tag: Tag(build_id, _now()) for tag in tags})
        return tags

    def failed(self, build: Build, message: str) -> None:
        """A failed build fails its status and takes no tag: the tags stay with the builds that made the template."""
        build.fail(message)
        known = self.tags.get(build.template, {})
        for tag in [tag for tag, info in known.items() if info.build_id == build.build_id]:
            del known[tag]

    def tags_of(self, template: str) -> dict[str, Tag]:
        found = self.tags.get(template)
        if not found:
            raise NotFound(f"template {template!r} has no tags here: it was not built through E2B's API")
        return found

    # -- uploaded files -----------------------------------------------------------------------------

    def upload_path(self, tenant: str, files_hash: str) -> Path:
        if not _HASH.match(files_hash):
            raise InvalidRequest(f"files hash {files_hash!r} is not a SHA-256 in hex")
        owner = hashlib.sha256(tenant.encode()).hexdigest()[:16]  # a tenant never finds another's files
        return self._files / owner / files_hash

    def has_upload(self, tenant: str, files_hash: str) -> bool:
        return self.upload_path(tenant, files_hash).is_file()

    def store_upload(self, tenant: str, files_hash: str, archive: bytes) -> None:
        path = self.upload_path(tenant, files_hash)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".partial-{uuid.uuid4().hex}")
        partial.write_bytes(archive)
        partial.rename(path)

    # -- the template a build makes -----------------------------------------------------------------

    def template(self, build: Build, start: BuildStart, context: Path) -> SandboxTemplate:
        """The Dockerfile template of a build, its context unpacked into `context` (which the caller removes)."""
        lines = [_from(start)]
        build.steps[1] = "base"
        # E2B builds as its default user in its home, unless the steps say otherwise (so does its from_dockerfile)
        lines += [f"USER {DEFAULT_USER}", f"WORKDIR {DEFAULT_WORKDIR}"]
        user = DEFAULT_USER
        for number, step in enumerate(start.steps, 1):
            made, user = self._step(build.tenant, step, user, context)
            for line in made:
                lines.append(line)
                build.steps[len(lines)] = str(number)
        if start.start_cmd or start.ready_cmd:
            lines.append("LABEL " + " ".join(f"{key}={json.dumps(value)}" for key, value in
                                              (("dev.e2b.start-cmd", start.start_cmd),
                                               ("dev.e2b.ready-cmd", start.ready_cmd)) if value))
            build.steps[len(lines)] = "finalize"
        limits = {key: value for key, value in (("cpu", build.cpu), ("memory", f"{build.memory_mb}Mi"
                                                                       if build.memory_mb else None)) if value}
        template = SandboxTemplate.model_validate({
            "metadata": {"name": build.template},
            "spec": {"dockerfile": "Dockerfile", **({"limits": limits} if limits else {})}})
        template.context_root, template.dockerfile_text = str(context), "\n".join(lines) + "\n"
        return template

    def _step(self, tenant: str, step: Step, user: str, context: Path) -> tuple[list[str], str]:
        args, kind = step.args, step.type.upper()
        if kind == "RUN" and args:
            command = "RUN " + json.dumps(["/bin/sh", "-c", args[0]])  # the exec form takes any text as it is
            if len(args) > 1 and args[1] and args[1] != user:
                return [f"USER {args[1]}", command, f"USER {user}"], user
            return [command], user
        if kind == "COPY" and len(args) >= 2:
            if step.files_hash is None or not self.has_upload(tenant, step.files_hash):
                raise InvalidRequest(f"COPY {args[0]}: its files (hash {step.files_hash}) were not uploaded first")
            unpack_context(self.upload_path(tenant, step.files_hash).read_bytes(), context)
            owner = args[2] if len(args) > 2 and args[2] else user
            mode = f" --chmod={args[3]}" if len(args) > 3 and args[3] else ""
            return [f"COPY --chown={owner}{mode} {json.dumps(args[:2])}"], user
        if kind == "ENV" and args and len(args) % 2 == 0:
            return ["ENV " + " ".join(f"{key}={_quoted(value)}" for key, value in zip(args[::2], args[1::2],
                                                                                      strict=True))], user
        if kind == "WORKDIR" and args:
            return [f"WORKDIR {args[0]}"], user
        if kind == "USER" and args:
            return [f"USER {args[0]}"], args[0]
        raise InvalidRequest(f"step {step.type} {args}: rollbox builds RUN, COPY, ENV, WORKDIR and USER steps")


def split_name(name: str) -> tuple[str, list[str]]:
    """`name` or `name:tag`: the rollbox template's name and the tags the build takes."""
    template, _, tag = name.partition(":")
    return template, [tag] if tag else []


def _from(start: BuildStart) -> str:
    if start.from_image_registry is not None:
        raise InvalidRequest("registry credentials are not taken through E2B's API: pull the image with rollbox's "
                             "own credentials (docs/images.md), or use a public image")
    if start.from_template:
        return f"FROM {start.from_template}"
    if start.from_image:
        return f"FROM {start.from_image}"
    raise InvalidRequest("a build needs fromImage or fromTemplate")


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _now() -> str:
    return datetime.fromtimestamp(time.time(), UTC).isoformat().replace("+00:00", "Z")

