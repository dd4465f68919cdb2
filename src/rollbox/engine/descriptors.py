"""The kernel's moves the files API is made of: opening a path resolved inside a root (openat2 with
RESOLVE_IN_ROOT), and walking or removing a tree one directory descriptor at a time, never by a path.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple

from rollbox.errors import InvalidRequest

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_SUBDIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How a walk opens a directory it found by name: never through a symlink swapped in for it."""
MAX_DEPTH = 1024
"""Levels of directories below its target that a recursive files call walks."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dir_fd: int, path: str, flags: int, mode: int = 0, resolve: int = RESOLVE_IN_ROOT) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve | RESOLVE_NO_MAGICLINKS)
    while True:
        fd = _libc.syscall(_SYS_OPENAT2, dir_fd, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code not in (errno.EINTR, errno.EAGAIN):
            raise OSError(code, os.strerror(code), path)


def remove_tree_at(parent: int, name: str, path: str) -> None:
    fd = os.open(name, _SUBDIRECTORY, dir_fd=parent)
    try:
        for dir_fd, _, entry, info in walk(fd, path):
            if info is None:
                os.rmdir(entry, dir_fd=dir_fd)
            elif not stat.S_ISDIR(info.st_mode):
                os.unlink(entry, dir_fd=dir_fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


class _Level(NamedTuple):
    """One directory of a walk's current path: its descriptor, where it is, its name, its entries still to give."""

    fd: int
    directory: str
    name: str
    names: Iterator[str]


def walk(top: int, path: str) -> Iterator[tuple[int, str, str, os.stat_result | None]]:
    """Every entry below directory `top`, parents first, as (its directory's descriptor, that directory
    relative to `top`, name, lstat); once a directory's entries are all given, the directory comes
    again with None instead of its lstat (then it can be removed).

    A sandbox can nest directories deeper than Python's stack or the host's PATH_MAX: the walk is a
    loop over one descriptor per level, never a path and never `..`, and it stops at MAX_DEPTH levels
    so that one call cannot take the server's descriptors.
    """
    levels = [_Level(top, ".", "", iter(os.listdir(top)))]
    try:
        while levels:
            level = levels[-1]
            name = next(level.names, None)
            if name is None:
                levels.pop()
                if levels:
                    os.close(level.fd)
                    yield levels[-1].fd, levels[-1].directory, level.name, None
                continue
            info = os.stat(name, dir_fd=level.fd, follow_symlinks=False)
            yield level.fd, level.directory, name, info
            if stat.S_ISDIR(info.st_mode):
                if len(levels) > MAX_DEPTH:
                    raise InvalidRequest(f"{path}: directories nest more than {MAX_DEPTH} levels deep, where the "
                                         "files API stops; run a command in the sandbox for this tree (rm, tar)")
                levels.append(_opened(level, name))
    finally:
        for level in levels[1:]:
            os.close(level.fd)


def _opened(parent: _Level, name: str) -> _Level:
    """The level of `parent`'s subdirectory `name` (opened not through a symlink), listed."""
    fd = os.open(name, _SUBDIRECTORY, dir_fd=parent.fd)
    try:
        return _Level(fd, f"{parent.directory}/{name}", name, iter(os.listdir(fd)))
    except BaseException:
        os.close(fd)
        raise
