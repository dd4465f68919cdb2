"""Tasks with verifiable rewards: a problem, a repository to start from, and hidden tests that judge it.

The format is documented in docs/tasks.md. A task file (YAML or JSON) holds one task, a list of
tasks, or `{defaults: {...}, tasks: [...]}` where every task is merged over the defaults. Paths in a
file (`repo.files`, `tests.dir`) are relative to the file's directory; loading reads hidden test
files into the task, so a loaded task is self-contained apart from its repository.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollbox._problems import problems
from rollbox.errors import InvalidResource


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Edit(_Model):
    """Replace the one occurrence of `old` in `path` (relative to the task's workdir) with `new`."""

    path: str
    old: str
    new: str


class Repo(_Model):
    """Where the repository comes from: a host directory, or a commit of a git repository on the host."""

    files: str | None = None
    exclude: tuple[str, ...] = ()
    """Glob patterns (relative to `files`) never uploaded, e.g. the hidden tests' directory."""
    git: str | None = None
    commit: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Repo:
        if (self.files is None) == (self.git is None):
            raise ValueError("a repo has exactly one of: files (a directory) or git (with commit)")
        if self.git is not None and not self.commit:
            raise ValueError("repo.git needs a commit")
        return self


class HiddenTests(_Model):
    """The hidden tests. They enter the sandbox only at verification, over whatever the agent left."""

    files: dict[str, str] = Field(default_factory=dict)
    """Test files by path relative to the workdir, written at verification."""
    patch: str | None = None
    """A unified diff applied with `git apply` at verification, after the files it touches are put back as the
    repository's HEAD has them (SWE-bench's own way, for tasks whose image holds the repository)."""
    clean: tuple[str, ...] = ()
    """Paths (relative to the workdir) removed before the files are written, e.g. a whole tests directory."""
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    command: str | None = None
    """A pytest-style command printing `PASSED id` / `FAILED id` lines (pytest -rA); None: the built-in runner."""
    python: str = "python3"
    timeout: float = 60.0
    per_test_timeout: float = 10.0
    partial_credit: bool = False

    @model_validator(mode="after")
    def _has_tests(self) -> HiddenTests:
        if not self.fail_to_pass:
            raise ValueError("tests.fail_to_pass lists at least one test")
        return self


class Task(_Model):
    id: str
    problem_statement: str
    template: str | None = None
    image: str | None = None
    """A registry image the task's sandbox starts from, instead of a template (docs/images.md)."""
    warmpool: str | None = None
    workdir: str = "/work/repo"
    repo: Repo | None = None
    """None when the template already holds the repository at `workdir`."""
    setup: tuple[str, ...] = ()
    """Shell commands run in `workdir` once the repository is in place."""
    setup_edits: tuple[Edit, ...] = ()
    """Edits applied after `setup`, e.g. the bug an example task plants."""
    tests: HiddenTests
    solution: tuple[Edit, ...] | str | None = None
    """The reference fix: edits, or a unified diff applied with `git apply`."""
    candidates: tuple[tuple[Edit, ...], ...] = ()
    """Optional alternative fixes (for the example candidate policy); `solution` is added to them."""
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _absolute_workdir(self) -> Task:
        if not self.workdir.startswith("/"):
            raise ValueError("workdir must be an absolute path")
        if (self.template is None) == (self.image is None):
            raise ValueError("a task starts from a template or from an image: give exactly one")
        return self

    @property
    def start(self) -> dict[str, str | None]:
        """What a claim of the task's sandbox names: its template or image, and a warm pool."""
        return {"template": self.template, "warmpool": self.warmpool} if self.template else \
            {"image": self.image, "warmpool": self.warmpool}


def load_tasks(path: str | Path) -> list[Task]:
    """Loads every task of a file, or of every *.yaml, *.yml, *.json and *.jsonl file of a directory."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json", ".jsonl"))
        tasks = [task for file in files for task in load_tasks(file)]
    elif path.suffix == ".jsonl":
        tasks = [_task(json.loads(line), path.parent) for line in path.read_text().splitlines() if line.strip()]
    else:
        tasks = parse_tasks(yaml.safe_load(path.read_text()), path.parent, str(path))
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise InvalidResource(f"{path}: task id {task.id!r} appears twice")
        seen.add(task.id)
    return tasks


def parse_tasks(document: Any, base: Path, source: str = "tasks") -> list[Task]:
    """Tasks of one parsed document (a task, a list of tasks, or defaults plus tasks)."""
    if isinstance(document, dict) and "tasks" in document:
        defaults = document.get("defaults") or {}
        items: Iterable[Any] = [_merge(defaults, item) for item in document["tasks"]]
    elif isinstance(document, list):
        items = document
    else:
        items = [document]
    tasks = []
    for number, item in enumerate(items):
        try:
            tasks.append(_task(item, base))
        except ValidationError as error:
            raise InvalidResource(f"{source}: task {_name(item, number)}: {problems(error, 'task')}") from None
        except (ValueError, OSError) as error:
            raise InvalidResource(f"{source}: task {_name(item, number)}: {error}") from None
    return tasks


def _name(item: Any, number: int) -> str:
    return str(item.get("id", f"#{number}")) if isinstance(item, dict) else f"#{number}"


def _task(item: Any, base: Path) -> Task:
    if not isinstance(item, dict):
        raise ValueError("a task is a mapping with id, problem_statement, template and tests")
    item = dict(item)
    repo = item.get("repo")
    if isinstance(repo, dict):
        item["repo"] = {**repo, **{key: str((base / repo[key]).resolve()) for key in ("files", "git") if repo.get(key)}}
    if isinstance(item.get("tests"), dict) and "dir" in item["tests"]:
        item["tests"] = _read_test_dir(dict(item["tests"]), base)
    return Task.model_validate(item)


def _read_test_dir(tests: dict[str, Any], base: Path) -> dict[str, Any]:
    """Turns `dir: <host dir>, dest: <path in workdir>` into hidden files; `dest` is cleaned at verification."""
    source = (base / tests.pop("dir")).resolve()
    dest = tests.pop("dest", source.name).strip("/")
    if not source.is_dir():
        raise ValueError(f"tests.dir {source} is not a directory")
    files = {f"{dest}/{p.relative_to(source)}": p.read_text() for p in sorted(source.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts}
    return {**tests, "files": {**files, **tests.get("files", {})}, "clean": [dest, *tests.get("clean", [])]}


def _merge(defaults: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    merged = dict(defaults)
    for key, value in item.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged
