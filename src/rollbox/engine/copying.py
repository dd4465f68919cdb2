"""COPY and ADD: files of a build context or an earlier stage, and the members of a tar archive, written into an image.

Both sides are resolved inside their own roots (openat2 RESOLVE_IN_ROOT): a source's symlinks and `..` never reach
out of the build context or the stage, and the destination's links (an image's `/bin -> usr/bin`) resolve as they
would inside the image, never on the host. The destination is an overlay of the image being built, whose upper
directory becomes the step's layer.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import stat
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from e2b_dockerfile_utils import PatternMatcher

from rollbox.engine.descriptors import openat2, walk
from rollbox.engine.files import ContainerFiles, root_fd
from rollbox.errors import InvalidResource, RollboxError

NO_LIMIT = 2**63 - 1
_MAGIC = frozenset("*?[")
Say = Callable[[str], None]


@dataclass(frozen=True)
class Entry:
    """One file, directory or link to copy: where it is under the source root and where it goes in the image."""

    source: str
    dest: str
    kind: str
    """"file", "dir" or "link"."""
    mode: int
    target: str = ""
    """A link's text (copied as it is: it resolves inside the image)."""
    follow: bool = False
    """A source named by the COPY itself: a link there is followed (inside the source root), as Docker does."""


class Sources:
    """The entries COPY sources name under one root (a build context, or a mounted stage)."""

    def __init__(self, root: Path, ignore: PatternMatcher | None, where: str, what: str) -> None:
        self.root = root
        self.ignore = ignore
        self.where = where
        """The instruction, for messages ("line 7: COPY")."""
        self.what = what
        """The root, for messages ("build context", "stage")."""

    def select(self, patterns: list[str], dest: str, dest_is_dir: Callable[[str], bool]) -> list[Entry]:
        """Every entry the sources name, with its place under `dest` (absolute) by Docker's rules: a directory's
        contents go into `dest`; a file goes to `dest`, or into it when `dest` ends in '/', is a directory already,
        or takes several sources."""
        with root_fd(self.root) as root:
            tops = [(top, not _MAGIC & set(pattern)) for pattern in patterns for top in self._expand(root, pattern)]
            into = dest.endswith("/") or len(tops) > 1 or dest_is_dir(dest)
            entries: list[Entry] = []
            for top, follow in tops:
                entries.extend(self._entries(root, top, dest.rstrip("/") or "/", into, follow))
        return entries

    def _expand(self, root: int, pattern: str) -> list[str]:
        """The paths a source pattern names (Docker's wildcards), none of them ignored."""
        clean = posixpath.normpath("/" + pattern).lstrip("/") or "."
        if posixpath.normpath(pattern).startswith("../") or posixpath.normpath(pattern) == "..":
            raise InvalidResource(f"{self.where} source {pattern!r} leaves the build context: sources are paths in "
                                  "the build context (or the stage's root)")
        found = [""]
        for part in ([] if clean == "." else clean.split("/")):
            if not _MAGIC & set(part):
                found = [posixpath.join(prefix, part) for prefix in found]
                continue
            found = [posixpath.join(prefix, name) for prefix in found for name in self._names(root, prefix)
                     if fnmatch.fnmatchcase(name, part)]
        visible = sorted(path or "." for path in found if not self._ignored(path))
        if not visible or (not _MAGIC & set(clean) and not self._exists(root, visible[0])):
            raise InvalidResource(f"{self.where} source {pattern!r} is not in the {self.what}"
                                  f"{' (or .dockerignore leaves it out)' if self.ignore else ''}")
        return visible

    def _names(self, root: int, directory: str) -> list[str]:
        try:
            fd = openat2(root, directory or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return []
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def _exists(self, root: int, path: str) -> bool:
        try:
            os.close(openat2(root, path, os.O_PATH))
            return True
        except OSError:
            return False

    def _ignored(self, path: str) -> bool:
        return bool(self.ignore and path and path != "." and self.ignore.matches(path))

    def _entries(self, root: int, top: str, dest: str, into: bool, follow: bool) -> list[Entry]:
        """What one source holds. A source named as it is (no wildcard) is followed if it is a link, as Docker does;
        a link a wildcard found is copied as a link."""
        target = posixpath.join(dest, posixpath.basename(top)) if into else dest
        try:
            fd = openat2(root, top, os.O_PATH | (0 if follow else os.O_NOFOLLOW))
        except OSError as error:
            raise InvalidResource(f"{self.where} source {top!r} is not in the {self.what}: "
                                  f"{error.strerror}") from None
        try:
            info = os.fstat(fd)
            if stat.S_ISLNK(info.st_mode):
                return [Entry(top, target, "link", 0o777, os.readlink("", dir_fd=fd))]
            if not stat.S_ISDIR(info.st_mode):
                if not stat.S_ISREG(info.st_mode):
                    raise InvalidResource(f"{self.where} source {top!r} is not a file or a directory")
                return [Entry(top, target, "file", stat.S_IMODE(info.st_mode), follow=True)]
            entries = [Entry(top, dest, "dir", 0o755, follow=True)]  # its contents are copied; `dest` made as mkdir -p
            listed = openat2(root, top, os.O_RDONLY | os.O_DIRECTORY)
            try:
                entries.extend(self._walked(listed, top, dest))
            finally:
                os.close(listed)
            return entries
        finally:
            os.close(fd)

    def _walked(self, fd: int, top: str, dest: str) -> Iterator[Entry]:
        for dir_fd, directory, name, child in walk(fd, top):
            if child is None:
                continue
            inner = posixpath.normpath(f"{directory}/{name}")
            named = posixpath.normpath(f"{top}/{inner}")
            if self._ignored(named):
                continue
            kind = "dir" if stat.S_ISDIR(child.st_mode) else "file" if stat.S_ISREG(child.st_mode) else \
                "link" if stat.S_ISLNK(child.st_mode) else None
            if kind is None:
                continue  # a device, FIFO or socket: nothing a build copies
            link = os.readlink(name, dir_fd=dir_fd) if kind == "link" else ""
            yield Entry(named, posixpath.join(dest, inner), kind, stat.S_IMODE(child.st_mode), link)

    @contextmanager
    def open(self, entry: Entry) -> Iterator[int]:
        """A file entry, opened for reading (inside the root; never through a link but the source's own)."""
        with root_fd(self.root) as root:
            flags = os.O_RDONLY | os.O_NONBLOCK | (0 if entry.follow else os.O_NOFOLLOW)
            fd = openat2(root, entry.source, flags)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidResource(f"{self.where} source {entry.source!r} changed while it was copied")
            yield fd
        finally:
            os.close(fd)

    def digest(self, entries: list[Entry]) -> str:
        """What the entries hold (paths, kinds, modes, link texts and contents): a copy's cache key."""
        digest = hashlib.sha256()
        for entry in entries:
            digest.update(f"{entry.dest}\0{entry.kind}\0{entry.mode:o}\0{entry.target}\0".encode())
            if entry.kind == "file":
                with self.open(entry) as fd:
                    while chunk := os.read(fd, 1 << 20):
                        digest.update(chunk)
        return digest.hexdigest()


class Writer:
    """Writes entries into an image's root, owned by `uid:gid` (or, for a tar's members, their own owners)."""

    def __init__(self, rootfs: Path, workdir: str, owner: tuple[int, int] | None, mode: int | None) -> None:
        self.rootfs = rootfs
        self.workdir = workdir
        self.owner = owner
        self.mode = mode
        self._files: dict[tuple[int, int], ContainerFiles] = {}

    def files(self, uid: int = 0, gid: int = 0) -> ContainerFiles:
        owner = self.owner or (uid, gid)
        if owner not in self._files:
            self._files[owner] = ContainerFiles(str(self.rootfs), self.workdir, *owner, max_upload=NO_LIMIT)
        return self._files[owner]

    def is_dir(self, path: str) -> bool:
        return self.files().kind(path) == "dir"

    def copy(self, sources: Sources, entries: list[Entry]) -> None:
        for entry in entries:
            if entry.kind == "dir":
                self.directory(entry.dest, entry.mode)
            elif entry.kind == "link":
                self.link(entry.dest, entry.target)
            else:
                with sources.open(entry) as fd, os.fdopen(os.dup(fd), "rb") as handle:
                    self.files().write(entry.dest, handle, self.mode if self.mode is not None else entry.mode)

    def directory(self, path: str, mode: int, uid: int = 0, gid: int = 0) -> None:
        files = self.files(uid, gid)
        existed = files.kind(path) == "dir"
        files.mkdir(path)
        if not existed or self.mode is not None:
            files.chmod(path, self.mode if self.mode is not None else mode)

    def link(self, path: str, target: str, uid: int = 0, gid: int = 0) -> None:
        files = self.files(uid, gid)
        if files.kind(path) is not None or _is_link(files, path):
            files.remove(path)
        files.symlink(path, target)

    def extract(self, sources: Sources, entry: Entry, dest: str, say: Say) -> bool:
        """ADD of a local tar archive (plain or compressed): its members under directory `dest`; one that would land
        outside it is refused, devices and FIFOs are skipped. False (and nothing written) for a file that is no
        archive, which ADD copies as COPY does."""
        with sources.open(entry) as fd, os.fdopen(os.dup(fd), "rb") as handle:
            archive = _archive(handle)
            if archive is None:
                return False
            with archive:
                self.directory(dest, 0o755)
                for member in archive:
                    self._member(archive, member, dest, sources.where, say)
        return True

    def _member(self, archive: tarfile.TarFile, member: tarfile.TarInfo, dest: str, where: str, say: Say) -> None:
        if ".." in member.name.split("/"):
            raise InvalidResource(f"{where}: the archive's member {member.name!r} climbs out of the directory it is "
                                  "unpacked into")
        name = posixpath.normpath("/" + member.name).lstrip("/")
        if not name:
            return
        try:
            self._write_member(archive, member, dest, name, where, say)
        except (RollboxError, FileNotFoundError, NotADirectoryError) as error:
            if isinstance(error, InvalidResource):
                raise
            raise InvalidResource(f"{where}: the archive's member {member.name!r} cannot be written: {error}") from None

    def _write_member(self, archive: tarfile.TarFile, member: tarfile.TarInfo, dest: str, name: str, where: str,
                      say: Say) -> None:
        path = posixpath.join(dest, name)
        mode, uid, gid = member.mode & 0o7777, member.uid, member.gid
        if member.isdir():
            self.directory(path, mode, uid, gid)
        elif member.isfile():
            extracted = archive.extractfile(member)
            if extracted is not None:
                self.files(uid, gid).write(path, extracted, self.mode if self.mode is not None else mode)
        elif member.issym():
            self.link(path, member.linkname, uid, gid)
        elif member.islnk():
            self.files().hard_link(posixpath.join(dest, posixpath.normpath("/" + member.linkname).lstrip("/")), path)
        else:
            say(f"{where}: skipped {member.name} (a device or FIFO: a build makes none)")


def _archive(handle: BinaryIO) -> tarfile.TarFile | None:
    try:
        return tarfile.open(fileobj=handle, mode="r:*")  # the caller closes it
    except tarfile.TarError:
        return None


def _is_link(files: ContainerFiles, path: str) -> bool:
    try:
        return files.stat(path).type == "symlink"
    except RollboxError:
        return False
