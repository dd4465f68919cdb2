"""File operations on a sandbox's root filesystem, done from the host without escaping it.

Every path is resolved by the kernel with openat2(RESOLVE_IN_ROOT): `..`, absolute symlinks and
relative symlinks all stay inside the sandbox root, and a symlink swapped in during a call cannot
redirect it, because each operation works on a directory file descriptor resolved once. Only the
last path component is ever named in a second call, and it never contains a slash.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import PurePosixPath
from typing import BinaryIO

from rollbox.engine.descriptors import openat2, remove_tree_at, walk
from rollbox.errors import Conflict, FileNotFound, InvalidPath, InvalidRequest, RollboxError, TooLarge
from rollbox.models import FileInfo

_MAX_PATH = 4096
XATTR_PREFIX = "user."
"""The extended attributes a file's metadata is kept in (user ones only: the others are the kernel's)."""
MAX_ACCOUNTS = 1 << 20
"""Bytes of the sandbox's /etc/passwd or /etc/group read at most to name owners."""


def _clean(path: str) -> str:
    """Normalises a sandbox path to a relative one; the kernel still does the real containment."""
    if not isinstance(path, str) or not path or "\0" in path or len(path) > _MAX_PATH:
        raise InvalidPath(f"{path!r} is not a valid path: give an absolute or home-relative path")
    return path


def _split(path: str) -> tuple[str, str]:
    pure = PurePosixPath(path)
    name = pure.name
    if name in ("", ".", ".."):
        raise InvalidPath(f"{path!r} does not name a file")
    parent = str(pure.parent)
    return parent, name


@contextmanager
def root_fd(root: str | os.PathLike[str]) -> Iterator[int]:
    """A descriptor of a root directory, for openat2 to resolve paths inside it."""
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


class ContainerFiles:
    """Files of one container. Relative paths are taken from `home`; ownership defaults to `uid:gid`."""

    def __init__(self, root: str, home: str, uid: int, gid: int, max_upload: int) -> None:
        self.root = root
        self.home = home
        self.uid = uid
        self.gid = gid
        self.max_upload = max_upload
        self._names: tuple[dict[int, str], dict[int, str]] | None = None

    def _absolute(self, path: str) -> str:
        path = _clean(path)
        return path if path.startswith("/") else f"{self.home.rstrip('/')}/{path}"

    def _root_fd(self) -> contextlib.AbstractContextManager[int]:
        return root_fd(self.root)

    @contextmanager
    def _open(self, path: str, flags: int, mode: int = 0) -> Iterator[int]:
        with self._root_fd() as root:
            try:
                fd = openat2(root, self._absolute(path), flags, mode)
            except OSError as error:
                raise _translate(error, path) from None
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _parent(self, path: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """The directory holding `path` (opened inside the root) and the last component's name."""
        parent, name = _split(self._absolute(path))
        if create:
            self.mkdir(parent, parents=True)
        with self._open(parent, os.O_PATH | os.O_DIRECTORY) as fd:
            yield fd, name

    def read(self, path: str, limit: int | None = None) -> bytes:
        limit = limit or self.max_upload
        # Non-blocking: a FIFO planted by the sandbox must not hang the host's read.
        with self._open(path, os.O_RDONLY | os.O_NONBLOCK) as fd:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise InvalidRequest(f"{path} is a directory: use list or download_dir")
            if not stat.S_ISREG(info.st_mode):
                raise InvalidRequest(f"{path} is not a regular file (a FIFO, socket or device): it cannot be read")
            if info.st_size > limit:
                raise TooLarge(f"{path} is {info.st_size} bytes, more than the {limit}-byte limit")
            chunks, size = [], 0
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"{path} is more than the {limit}-byte limit")
            return b"".join(chunks)

    def write(self, path: str, data: bytes | str | BinaryIO, mode: int = 0o644,
              metadata: dict[str, str] | None = None) -> FileInfo:
        """Writes the file whole (a new file renamed over the old one, so a reader sees one or the other; a file
        object is copied in chunks, never held in memory) and answers what it wrote; `metadata` becomes its user
        extended attributes (an overwrite drops the old ones)."""
        data = data.encode() if isinstance(data, str) else data
        if isinstance(data, bytes) and len(data) > self.max_upload:
            raise TooLarge(f"{len(data)} bytes is more than the {self.max_upload}-byte upload limit")
        with self._parent(path, create=True) as (parent, name):
            temp = f".{name}.rollbox-{os.getpid()}-{id(data):x}"
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             mode & 0o7777, dir_fd=parent)
            except OSError as error:
                raise _translate(error, path) from None
            try:
                self._fill(fd, data)
                os.fchmod(fd, mode & 0o7777)
                os.fchown(fd, self.uid, self.gid)
                for key, value in (metadata or {}).items():
                    os.setxattr(fd, XATTR_PREFIX + key, value.encode())
                written = os.fstat(fd)
            except BaseException as error:
                os.close(fd)
                with suppress(OSError):
                    os.unlink(temp, dir_fd=parent)
                if isinstance(error, OSError):
                    raise _translate(error, path) from None
                raise
            os.close(fd)
            try:
                os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except OSError as error:
                with suppress(OSError):
                    os.unlink(temp, dir_fd=parent)
                raise _translate(error, path) from None
        return self._info(self._absolute(path), name, written, None, dict(metadata) if metadata else None)

    def _fill(self, fd: int, data: bytes | BinaryIO) -> None:
        chunks = iter((data,)) if isinstance(data, bytes) else iter(lambda: data.read(1 << 20), b"")
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if size > self.max_upload:
                raise TooLarge(f"more than the {self.max_upload}-byte upload limit")
            view = memoryview(chunk)
            while view:
                written = os.write(fd, view)
                view = view[written:]

    def mkdir(self, path: str, parents: bool = True, mode: int = 0o755) -> None:
        parts = [p for p in PurePosixPath(self._absolute(path)).parts if p != "/"]
        with self._root_fd() as root:
            parent = os.dup(root)
            try:
                for index, part in enumerate(parts):
                    prefix = "/" + "/".join(parts[: index + 1])
                    try:
                        current = openat2(root, prefix, os.O_PATH | os.O_DIRECTORY)
                    except FileNotFoundError:
                        if not parents and index < len(parts) - 1:
                            raise FileNotFound(f"{path}: a parent directory does not exist") from None
                        try:
                            os.mkdir(part, mode, dir_fd=parent)
                            os.chown(part, self.uid, self.gid, dir_fd=parent, follow_symlinks=False)
                        except FileExistsError:
                            pass
                        except OSError as error:
                            raise _translate(error, path) from None
                        current = openat2(parent, part, os.O_PATH | os.O_DIRECTORY)
                    except OSError as error:
                        raise _translate(error, path) from None
                    os.close(parent)
                    parent = current
            finally:
                os.close(parent)

    def chmod(self, path: str, mode: int) -> None:
        with self._open(path, os.O_RDONLY | os.O_NONBLOCK) as fd:
            os.fchmod(fd, mode & 0o7777)

    def hard_link(self, existing: str, path: str) -> None:
        """Makes `path` another name of the file `existing` (replacing what is there); both resolve in the root."""
        with self._parent(existing) as (source_dir, source_name), self._parent(path, create=True) as (dest_dir, name):
            try:
                with suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dest_dir)
                os.link(source_name, name, src_dir_fd=source_dir, dst_dir_fd=dest_dir, follow_symlinks=False)
            except OSError as error:
                raise _translate(error, path) from None

    def exists(self, path: str) -> bool:
        try:
            with self._open(path, os.O_PATH):
                return True
        except FileNotFound:
            return False

    def kind(self, path: str) -> str | None:
        """What `path` is once its links are followed inside the root: "file", "dir" or "other"; None where nothing
        can be opened there (absent, a dangling or looping link), as a program inside the container would find."""
        try:
            with self._open(path, os.O_PATH) as fd:
                mode = os.fstat(fd).st_mode
        except RollboxError:
            return None
        return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"

    def stat(self, path: str) -> FileInfo:
        with self._parent(path) as (parent, name):
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except OSError as error:
                raise _translate(error, path) from None
            target = os.readlink(name, dir_fd=parent) if stat.S_ISLNK(info.st_mode) else None
            return self._info(self._absolute(path), name, info, target, _metadata(parent, name, info))

    def list(self, path: str = ".") -> list[FileInfo]:
        with self._open(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
            base = self._absolute(path).rstrip("/")
            entries = []
            for name in sorted(os.listdir(fd)):
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None
                entries.append(self._info(f"{base}/{name}", name, info, target, _metadata(fd, name, info)))
            return entries

    def _info(self, path: str, name: str, info: os.stat_result, target: str | None,
              metadata: dict[str, str] | None) -> FileInfo:
        users, groups = self._accounts()
        mode = info.st_mode
        kind = ("dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode)
                else "symlink" if stat.S_ISLNK(mode) else "other")
        return FileInfo(path=path, name=name, type=kind, size=info.st_size, mode=stat.S_IMODE(mode),
                        mtime=info.st_mtime, target=target, owner=users.get(info.st_uid, str(info.st_uid)),
                        group=groups.get(info.st_gid, str(info.st_gid)), metadata=metadata)

    def _accounts(self) -> tuple[dict[int, str], dict[int, str]]:
        """Users and groups by number, as the sandbox's own /etc/passwd and /etc/group name them."""
        if self._names is None:
            self._names = (self._table("/etc/passwd"), self._table("/etc/group"))
        return self._names

    def _table(self, path: str) -> dict[int, str]:
        try:
            text = self.read(path, MAX_ACCOUNTS).decode(errors="replace")
        except RollboxError:
            return {}
        names: dict[int, str] = {}
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[2].isdigit():
                names.setdefault(int(fields[2]), fields[0])
        return names

    def remove(self, path: str, recursive: bool = False) -> None:
        with self._parent(path) as (parent, name):
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    os.unlink(name, dir_fd=parent)
                elif recursive:
                    remove_tree_at(parent, name, path)
                else:
                    os.rmdir(name, dir_fd=parent)
            except OSError as error:
                raise _translate(error, path) from None

    def upload_tar(self, path: str, archive: bytes) -> int:
        """Unpacks a tar archive into directory `path`; returns how many entries it wrote."""
        if len(archive) > self.max_upload:
            raise TooLarge(f"archive of {len(archive)} bytes is more than the {self.max_upload}-byte limit")
        base = self._absolute(path).rstrip("/") or "/"
        self.mkdir(base)
        count = 0
        with _open_tar(archive) as tar:
            for member in tar:
                relative = PurePosixPath(member.name.lstrip("/"))
                if ".." in relative.parts:
                    raise InvalidPath(f"tar entry {member.name!r} climbs out of its directory")
                if str(relative) in ("", "."):
                    continue
                target = f"{base}/{relative}"
                if member.isdir():
                    self.mkdir(target, mode=member.mode & 0o7777 or 0o755)
                elif member.isfile():
                    extracted = tar.extractfile(member)
                    self.write(target, extracted.read() if extracted else b"", mode=member.mode & 0o7777)
                elif member.issym():
                    self.symlink(target, member.linkname)
                else:
                    raise InvalidRequest(f"tar entry {member.name!r}: only files, directories and symlinks "
                                         "can be uploaded")
                count += 1
        return count

    def symlink(self, path: str, target: str) -> None:
        """Creates a symlink. Its target is only text: every later call still resolves it inside the root."""
        with self._parent(path, create=True) as (parent, name):
            try:
                os.symlink(target, name, dir_fd=parent)
                os.chown(name, self.uid, self.gid, dir_fd=parent, follow_symlinks=False)
            except OSError as error:
                raise _translate(error, path) from None

    def download_tar(self, path: str) -> bytes:
        """Packs directory `path` into a tar archive (symlinks are stored as links, never followed)."""
        buffer = io.BytesIO()
        total = 0
        with self._open(path, os.O_RDONLY | os.O_DIRECTORY) as top, tarfile.open(fileobj=buffer, mode="w") as tar:
            for dir_fd, directory, name, info in walk(top, path):
                if info is None:
                    continue
                member = tarfile.TarInfo(os.path.normpath(f"{directory}/{name}"))
                member.mode, member.mtime = info.st_mode & 0o7777, info.st_mtime
                if stat.S_ISDIR(info.st_mode):
                    member.type = tarfile.DIRTYPE
                    tar.addfile(member)
                elif stat.S_ISLNK(info.st_mode):
                    member.type, member.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
                    tar.addfile(member)
                elif stat.S_ISREG(info.st_mode):
                    total += info.st_size
                    if total > self.max_upload:
                        raise TooLarge(f"{path} holds more than the {self.max_upload}-byte limit")
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
                    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO after the stat
                        os.close(fd)
                        continue
                    with os.fdopen(fd, "rb") as handle:
                        member.size = info.st_size
                        tar.addfile(member, handle)
        return buffer.getvalue()


def _open_tar(archive: bytes) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=io.BytesIO(archive))
    except tarfile.TarError as error:
        raise InvalidRequest(f"not a tar archive: {error}") from None


def _metadata(parent: int, name: str, info: os.stat_result) -> dict[str, str] | None:
    """A file's or directory's user extended attributes (a link's are never followed, nor a device opened)."""
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        return None
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    try:
        handle = f"/proc/self/fd/{fd}"  # an O_PATH descriptor takes no xattr calls; its /proc link does
        found = {key[len(XATTR_PREFIX):]: os.getxattr(handle, key).decode(errors="replace")
                 for key in os.listxattr(handle) if key.startswith(XATTR_PREFIX)}
    except OSError:
        return None
    finally:
        os.close(fd)
    return found or None


def _translate(error: OSError, path: str) -> Exception:
    code = error.errno
    if code == errno.ENOENT:
        return FileNotFound(f"{path}: no such file or directory")
    if code == errno.ENOTDIR:
        return FileNotFound(f"{path}: a parent is not a directory")
    if code == errno.EXDEV:
        return InvalidPath(f"{path}: resolves outside the sandbox")
    if code == errno.ELOOP:
        return InvalidPath(f"{path}: too many symlinks")
    if code == errno.EISDIR:
        return InvalidRequest(f"{path} is a directory")
    if code == errno.EEXIST:
        return Conflict(f"{path} already exists")
    if code == errno.ENOTEMPTY:
        return Conflict(f"{path} is a directory that is not empty: pass recursive=True")
    if code == errno.ENOSPC:
        return TooLarge(f"{path}: the sandbox's disk limit is reached")
    if code == errno.ENAMETOOLONG:
        return InvalidPath(f"{path}: name too long")
    return InvalidRequest(f"{path}: {os.strerror(code or 0)}")
