"""Tar archives that carry directories between machines: a sandbox's files each way, and a template's build
context to the server that builds it.

Unpacking never lets a member land outside its directory: names that climb out, links followed by members
beneath them, devices and setuid bits are refused (tarfile's filters).
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path

from e2b_dockerfile_utils import PatternMatcher

from rollbox.errors import InvalidResource, TooLarge
from rollbox.spec import SandboxTemplate

MAX_CONTEXT_UNPACKED = 4 * 2**30
"""The most a build context may hold once unpacked (its archive is compressed: the request's own limit is not)."""


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Drops local owners: files belong to the sandbox's user once unpacked there."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack(local_dir: str | Path) -> bytes:
    """Packs the contents of `local_dir` (not the directory itself); symlinks stay links."""
    root = Path(local_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory: give the local directory to upload")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name, filter=_anonymous)
    return buffer.getvalue()


def _contained(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """The "data" filter, except that symlinks may point anywhere (a venv's `bin/python` does).

    A link is only text on this side: every member is still refused if it would land outside
    `dest`, following the links already unpacked.
    """
    if member.issym():
        return tarfile.tar_filter(member, dest)
    return tarfile.data_filter(member, dest)


def unpack(archive: bytes, local_dir: str | Path) -> None:
    """Unpacks into `local_dir`, refusing members that would land outside it, devices and setuid bits."""
    root = Path(local_dir)
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        tar.extractall(root, filter=_contained)


# -- build contexts ---------------------------------------------------------------------------------


def reads_files(template: SandboxTemplate) -> bool:
    """Whether a template's build reads files (a Dockerfile and its context, or `copy` steps' sources)."""
    return template.spec.dockerfile is not None or any(step.copy_ is not None for step in template.spec.steps)


def build_context(template: SandboxTemplate) -> Path:
    """The directory COPY and ADD read from: the context that came with the request, else the Dockerfile's build
    context or (YAML steps) the YAML's directory."""
    if template.context_root is not None:
        return Path(template.context_root)
    root = Path(template.context_dir or ".")
    if template.spec.dockerfile is None:
        return root
    if template.spec.context is not None:
        return root / template.spec.context
    return (root / template.spec.dockerfile).parent


def read_dockerfile(template: SandboxTemplate) -> str:
    """The Dockerfile's text: as it came with the template, else read from beside the YAML (the server reads none
    of its own files for a template sent with its context)."""
    if template.dockerfile_text is None and template.spec.dockerfile is not None:
        path = Path(template.context_dir or ".") / template.spec.dockerfile
        try:
            template.dockerfile_text = path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidResource(f"SandboxTemplate {template.metadata.name}: cannot read the Dockerfile "
                                  f"{template.spec.dockerfile!r} ({path}): {error}") from None
    return template.dockerfile_text or ""


def dockerignore(context: Path) -> PatternMatcher | None:
    """The build context's `.dockerignore`, as BuildKit reads it (a port of its matcher)."""
    try:
        text = (context / ".dockerignore").read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidResource(f"cannot read the build context's .dockerignore: {error}") from None
    try:
        return PatternMatcher(text.splitlines())
    except ValueError as error:
        raise InvalidResource(f".dockerignore: {error}") from None


def pack_context(context: Path, only: Iterable[str] | None = None) -> bytes:
    """A build context as a gzip'ed tar: the whole directory less what its `.dockerignore` leaves out, or (`only`)
    just the paths named. Links stay links and owners are dropped, as `docker build` sends a context."""
    if not context.is_dir():
        raise InvalidResource(f"the build context {context} is not a directory")
    ignore = dockerignore(context) if only is None else None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for top in sorted(only) if only is not None else ["."]:
            path = os.path.normpath(top.lstrip("/") or ".")
            if path != ".." and not path.startswith("../"):  # else the builder refuses it, naming its step
                _add(tar, context, "" if path == "." else path, ignore)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, context: Path, relative: str, ignore: PatternMatcher | None,
         send: bool = True) -> None:
    """Adds a path and what it holds; an ignored directory that a `!` pattern may take from is walked, not sent."""
    full = context / relative if relative else context
    if not full.exists() and not full.is_symlink():
        return  # the builder says it is missing, naming its step
    if relative and send:
        tar.add(full, arcname=relative, recursive=False, filter=_anonymous)
    if not full.is_dir() or full.is_symlink():
        return
    for child in sorted(os.listdir(full)):
        path = f"{relative}/{child}" if relative else child
        if ignore is None or not ignore.matches(path):
            _add(tar, context, path, ignore)
        elif ignore.may_match_under(path):
            _add(tar, context, path, ignore, send=False)


def unpack_context(archive: bytes, dest: Path, limit: int = MAX_CONTEXT_UNPACKED) -> None:
    """Unpacks a build context sent with a request; refuses one over `limit` bytes unpacked, or that climbs out."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            members, total = [], 0
            for member in tar:
                total += member.size
                if total > limit:
                    raise TooLarge(f"the build context holds more than {limit} bytes unpacked: leave out what the "
                                   "build does not need (.dockerignore)")
                members.append(member)
            tar.extractall(dest, members=members, filter=_contained)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile) as error:
        raise InvalidResource(f"the build context is not a tar archive that unpacks here: {error}") from None
