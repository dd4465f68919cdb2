"""Tasks from SWE-bench rows: each in its own instance image, or from a checkout on this machine.

A row has instance_id, repo, base_commit, patch (the reference fix), test_patch (the tests that
judge it), problem_statement, FAIL_TO_PASS and PASS_TO_PASS (JSON-encoded lists, as in the
dataset).

- With `image`, a pattern naming each row's instance image (SWE-bench's own hold the repository at
  base_commit in /testbed, with its Python and dependencies), the task starts from that image and its
  test patch is applied in the sandbox at verification, as SWE-bench's harness does.
- With `repos` and a `template`, the sandbox gets the repository at base_commit (as a fresh git
  repository, so agents can `git diff`); the files the test patch touches are computed here, on the
  host, and written only at verification. The template must provide the repository's Python and
  dependencies, and pytest unless `test_command` is None (the built-in runner).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rollbox.errors import InvalidRequest
from rollbox.rl.tasks import HiddenTests, Repo, Task

PYTEST = "python -m pytest -rA -p no:cacheprovider {files}"
"""The default test command; `{files}` becomes the test files the test patch touches."""
GIT_BASELINE = ("git init -q && git add -A && GIT_AUTHOR_DATE=2000-01-01T00:00:00Z "
                "GIT_COMMITTER_DATE=2000-01-01T00:00:00Z git -c user.name=rollbox -c user.email=rollbox@localhost "
                "commit -qm base")
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)

Repos = str | Path | Callable[[str], str | Path]
"""Where checkouts are: a directory holding `<owner>__<name>` (SWE-bench's naming), or a function of `repo`."""


def from_swebench(row: Mapping[str, Any], *, repos: Repos | None = None, template: str | None = None,
                  image: str | None = None, warmpool: str | None = None, workdir: str | None = None,
                  test_command: str | None = PYTEST, timeout: float = 1800.0) -> Task:
    """A task from one row: from the instance image `image` names (a pattern of the row's fields, e.g.
    `HOST/swebench/sweb.eval.x86_64.{docker_id}:latest`), or from a checkout under `repos` on `template`."""
    if image is not None:
        return _from_image(row, image, warmpool, workdir or "/testbed", test_command, timeout)
    if repos is None or template is None:
        raise InvalidRequest("give an image pattern, or repos and a template, to make SWE-bench tasks")
    workdir = workdir or "/work/repo"
    checkout = Path(repos(row["repo"]) if callable(repos) else Path(repos) / row["repo"].replace("/", "__"))
    if not (checkout / ".git").exists():
        raise InvalidRequest(f"{row['instance_id']}: no git checkout of {row['repo']} at {checkout}")
    files, removed = _tests_after_patch(checkout, row["base_commit"], row["test_patch"])
    command = test_command.format(files=" ".join(shlex.quote(f) for f in sorted(files))) if test_command else None
    return Task(
        id=row["instance_id"], problem_statement=row["problem_statement"], template=template, warmpool=warmpool,
        workdir=workdir, repo=Repo(git=str(checkout), commit=row["base_commit"]), setup=(GIT_BASELINE,),
        tests=HiddenTests(files=files, clean=tuple(removed), fail_to_pass=tuple(_list(row["FAIL_TO_PASS"])),
                          pass_to_pass=tuple(_list(row["PASS_TO_PASS"])), command=command, timeout=timeout),
        solution=row["patch"],
        metadata={key: row[key] for key in ("repo", "base_commit", "version", "created_at") if key in row})


IMAGE_FIELDS = ("{instance_id}, {docker_id} (SWE-bench's image name: '__' as '_1776_', lowercase), {repo}, {owner}, "
                "{name}")


def instance_image(pattern: str, row: Mapping[str, Any]) -> str:
    """The image a row's task starts from: `pattern` with the row's fields (IMAGE_FIELDS) put in."""
    owner, _, name = str(row["repo"]).partition("/")
    fields = {"instance_id": row["instance_id"], "docker_id": str(row["instance_id"]).replace("__", "_1776_").lower(),
              "repo": row["repo"], "owner": owner, "name": name}
    try:
        return pattern.format(**fields)
    except (KeyError, IndexError, ValueError) as error:
        raise InvalidRequest(f"image pattern {pattern!r}: {error}; its fields are {IMAGE_FIELDS}") from None


def _from_image(row: Mapping[str, Any], pattern: str, warmpool: str | None, workdir: str, test_command: str | None,
                timeout: float) -> Task:
    paths = sorted({path for pair in _DIFF_HEADER.findall(row["test_patch"]) for path in pair})
    command = test_command.format(files=" ".join(shlex.quote(f) for f in paths)) if test_command else None
    return Task(
        id=row["instance_id"], problem_statement=row["problem_statement"], image=instance_image(pattern, row),
        warmpool=warmpool, workdir=workdir,
        tests=HiddenTests(patch=row["test_patch"], fail_to_pass=tuple(_list(row["FAIL_TO_PASS"])),
                          pass_to_pass=tuple(_list(row["PASS_TO_PASS"])), command=command, timeout=timeout),
        solution=row["patch"],
        metadata={key: row[key] for key in ("repo", "base_commit", "version", "created_at") if key in row})


def load_swebench(rows: Iterable[Mapping[str, Any]] | str | Path, **options: Any) -> list[Task]:
    """Tasks from rows, or from a .json (list) or .jsonl file of rows; options as for `from_swebench`."""
    if isinstance(rows, str | Path):
        text = Path(rows).read_text()
        rows = json.loads(text) if str(rows).endswith(".json") else [json.loads(line) for line in text.splitlines()
                                                                     if line.strip()]
    return [from_swebench(row, **options) for row in rows]


def _list(value: str | list[str]) -> list[str]:
    return json.loads(value) if isinstance(value, str) else list(value)


def _tests_after_patch(checkout: Path, commit: str, test_patch: str) -> tuple[dict[str, str], list[str]]:
    """The content of every file the test patch leaves in place, and the files it deletes."""
    paths = sorted({path for pair in _DIFF_HEADER.findall(test_patch) for path in pair})
    git = ["git", "-C", str(checkout)]
    listed = subprocess.run([*git, "ls-tree", "-r", "-z", "--name-only", commit, "--", *paths], capture_output=True,
                            text=True, check=True).stdout
    existing = [path for path in listed.split("\0") if path]
    with tempfile.TemporaryDirectory(prefix="rollbox-swebench-") as work:
        if existing:
            archive = subprocess.run([*git, "archive", "--format=tar", commit, "--", *existing], capture_output=True,
                                     check=True)
            subprocess.run(["tar", "-x", "-C", work], input=archive.stdout, check=True)
        applied = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=work, input=test_patch.encode(),
                                 capture_output=True)
        if applied.returncode != 0:
            raise InvalidRequest(f"the test patch does not apply to {commit}: {applied.stderr.decode().strip()}")
        files = {path: (Path(work) / path).read_text() for path in paths if (Path(work) / path).is_file()}
    return files, [path for path in paths if path not in files]
