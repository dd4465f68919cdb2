"""A task's repository as a host directory holding exactly what the sandbox gets, staged once per process.

The SDK uploads a directory in one request; staging drops the excluded paths (the hidden tests)
and checks out a git commit without its history, so nothing of the answer reaches the sandbox.
"""

from __future__ import annotations

import atexit
import fnmatch
import io
import shutil
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

from rollbox.errors import InvalidRequest
from rollbox.rl.tasks import Repo

ALWAYS_EXCLUDED = ("__pycache__", "*.pyc", ".pytest_cache")

_staged: dict[Repo, Path] = {}
_lock = threading.Lock()


def staged(repo: Repo) -> Path:
    """The staged copy of `repo` (made on first use, removed when the process exits)."""
    with _lock:
        if repo not in _staged:
            target = Path(tempfile.mkdtemp(prefix="rollbox-repo-"))
            atexit.register(shutil.rmtree, target, True)
            if repo.files is not None:
                _copy(Path(repo.files), target, (*ALWAYS_EXCLUDED, *repo.exclude))
            else:
                _checkout(str(repo.git), str(repo.commit), target, repo.exclude)
            _staged[repo] = target
        return _staged[repo]


def _excluded(relative: str, patterns: tuple[str, ...]) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(name, p) for p in patterns)


def _copy(source: Path, target: Path, patterns: tuple[str, ...]) -> None:
    if not source.is_dir():
        raise InvalidRequest(f"repo.files {source} is not a directory")
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        if any(_excluded("/".join(relative.split("/")[: i + 1]), patterns) for i in range(relative.count("/") + 1)):
            continue
        destination = target / relative
        if path.is_symlink():
            destination.symlink_to(path.readlink())
        elif path.is_dir():
            destination.mkdir()
        else:
            shutil.copy2(path, destination)


def _checkout(git: str, commit: str, target: Path, exclude: tuple[str, ...]) -> None:
    process = subprocess.run(["git", "-C", git, "archive", "--format=tar", commit], capture_output=True)
    if process.returncode != 0:
        raise InvalidRequest(f"cannot check out {commit} of {git}: {process.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(process.stdout)) as tar:
        tar.extractall(target, filter="data")
    for pattern in exclude:
        for path in target.glob(pattern):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
