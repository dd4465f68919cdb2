"""A build plan: the stages of a template's build and the operations of each, as the builder runs them.

A template's YAML `steps` make a plan of one stage; a Dockerfile makes one of its stages (engine/dockerfile.py).
Operations hold their words as written: a Dockerfile's are expanded (ARG and ENV, as Docker does) only when the
builder reaches them, since they may name variables of the base image (`ENV PATH=/opt/bin:$PATH`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollbox.spec import TemplateSpec


@dataclass
class Op:
    line: int | None = field(default=None, kw_only=True)
    """The Dockerfile's line, for messages (None for a YAML step)."""
    material: Any = field(default=None, kw_only=True)
    """What names the step in its layer's cache key, when the step itself says (a YAML step's own fields)."""

    def where(self) -> str:
        return f"line {self.line}: " if self.line is not None else ""


@dataclass
class Run(Op):
    command: str | list[str]
    """A shell command (run by the stage's shell) or an argument vector (exec form)."""


@dataclass
class Copy(Op):
    sources: list[str]
    """Paths in the build context (or in `source`), glob patterns allowed."""
    dest: str
    """Absolute, or relative to the working directory; ending in `/` when it is a directory."""
    owner: str | None = None
    """user[:group] owning the copied files; None: root (Dockerfile) or the template's user (YAML)."""
    mode: str | None = None
    """Octal permissions for the copied files (`--chmod`)."""
    source: str | None = None
    """Copies from an earlier stage (its name or index) or an image, instead of the build context."""
    extract: bool = False
    """ADD: a local tar archive is unpacked into `dest`."""


@dataclass
class Env(Op):
    values: list[tuple[str, str]]


@dataclass
class Arg(Op):
    name: str
    default: str | None = None


@dataclass
class Workdir(Op):
    path: str


@dataclass
class User(Op):
    user: str


@dataclass
class Shell(Op):
    argv: list[str]


@dataclass
class Record(Op):
    """Something the image says about running it, recorded in the template's info but not acted on."""

    key: str
    value: Any
    expand: bool = False
    """Its words take ARG and ENV values (LABEL, EXPOSE, VOLUME, STOPSIGNAL), as Docker does."""

    def apply(self, config: dict[str, Any], expand: Callable[[str], str] | None) -> None:
        """Records it in an image's config (labels add up; ports and volumes too)."""
        if expand is None:
            config[self.key] = self.value
        elif self.key == "labels":
            config.setdefault(self.key, {}).update({expand(name): expand(text) for name, text in self.value})
        elif self.key in ("exposedPorts", "volumes"):
            config[self.key] = sorted(set(config.get(self.key, [])) | {expand(word) for word in self.value})
        else:
            config[self.key] = expand(self.value[0])


@dataclass
class Stage:
    base: str
    """FROM's reference, as written."""
    name: str | None = None
    line: int | None = None
    ops: list[Op] = field(default_factory=list)


@dataclass
class Plan:
    stages: list[Stage]
    target: int
    """The stage the template is (the last one, unless `spec.target` names another)."""
    global_args: list[Arg] = field(default_factory=list)
    """ARGs before the first FROM: they may be used in FROM lines, and redeclared in a stage."""
    escape: str | None = None
    """The Dockerfile's escape character, which expanding its words needs; None for YAML steps (never expanded)."""

    def needed(self) -> list[int]:
        """The stages the target needs (itself, and the stages it builds on or copies from), in order."""
        needed, todo = set(), [self.target]
        while todo:
            index = todo.pop()
            if index in needed:
                continue
            needed.add(index)
            stage = self.stages[index]
            refs = [stage.base] + [op.source for op in stage.ops if isinstance(op, Copy) and op.source]
            todo.extend(found for ref in refs if (found := self.stage_index(ref, stage)) is not None)
        return sorted(needed)

    def stage_index(self, ref: str, before: Stage | None) -> int | None:
        """The stage before `before` (any, when None) that `ref` names by name or number; None: `ref` is an image."""
        limit = self.stages.index(before) if before is not None else len(self.stages)
        for index, stage in enumerate(self.stages[:limit]):
            if stage.name == ref.lower() or ref == str(index):
                return index
        return None


def from_steps(spec: TemplateSpec) -> Plan:
    """The plan of a template's YAML steps: one stage on `spec.base`, each step keyed by its own fields."""
    ops: list[Op] = []
    for step in spec.steps:
        material = step.model_dump(by_alias=True, exclude_none=True)
        if step.run is not None:
            ops.append(Run(step.run, material=material))
        elif step.copy_ is not None:
            ops.append(Copy([step.copy_.src], step.copy_.dest, owner=step.copy_.owner, material=material))
        elif step.env is not None:
            ops.append(Env(list(step.env.items()), material=material))
        elif step.workdir is not None:
            ops.append(Workdir(step.workdir, material=material))
        elif step.user is not None:
            ops.append(User(step.user, material=material))
    return Plan([Stage(spec.base, ops=ops)], 0)
