"""Mount syscalls, called directly: spawning mount(8) would cost milliseconds per sandbox.

Overlays with many lower layers use the new mount API (`fsconfig` with `lowerdir+`, Linux 6.8+),
because the classic mount(2) option string is limited to one page (~150 absolute paths).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import time
from collections.abc import Sequence
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
_libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p]

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MNT_DETACH = 2
_SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT, _SYS_MOVE_MOUNT = 430, 431, 432, 429
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_MOVE_MOUNT_F_EMPTY_PATH = 4
_FSOPEN_CLOEXEC = 1
_FSMOUNT_CLOEXEC = 1
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4
_OPTION_PAGE = 4000
_AT_FDCWD, _AT_SYMLINK_NOFOLLOW, _AT_NO_AUTOMOUNT = -100, 0x100, 0x800
_STATX_SIZE = 256
_STATX_FIELDS = struct.Struct("=8xQ12xH26xQ")
"""struct statx's stx_attributes (offset 8), stx_mode (28) and stx_attributes_mask (56)."""
_STATX_ATTR_MOUNT_ROOT = 0x2000
WALK_BUDGET = 64
"""Entries `mounted_under` checks (a statx each) before it reads the mount table instead."""
_OVERLAY_OPTIONS = {"redirect_dir": "off", "index": "off", "metacopy": "off", "xino": "off"}


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def mount(source: str, target: str | Path, fstype: str | None, flags: int = 0, data: str = "") -> None:
    _check(
        _libc.mount(source.encode(), str(target).encode(), fstype.encode() if fstype else None,
                    flags, data.encode() if data else None),
        f"mount {fstype or 'bind'} on {target}",
    )


def umount(target: str | Path, lazy: bool = False, busy_wait: float = 2.0) -> None:
    """Unmounts `target`; a path that is not mounted is fine.

    A busy mount (processes of a just-killed container still exiting) is retried for `busy_wait`
    seconds before it is detached lazily: a lazily detached overlay keeps its upper in use, and
    an upper must be free before fork or snapshot turns it into a lower.
    """
    deadline = time.monotonic() + busy_wait
    while _libc.umount2(str(target).encode(), MNT_DETACH if lazy else 0) < 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOENT):
            return
        if code != errno.EBUSY or lazy:
            raise OSError(code, f"umount {target}: {os.strerror(code)}")
        if time.monotonic() > deadline:
            lazy = True
        else:
            time.sleep(0.005)


def mount_tmpfs(target: str | Path, size: int, mode: int = 0o755, inodes: int | None = None) -> None:
    options = f"size={size},mode={mode:o}"
    if inodes:
        options += f",nr_inodes={inodes}"
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options)


def mount_overlay(target: str | Path, lowers: Sequence[str | Path], upper: str | Path, work: str | Path) -> None:
    """Mounts an overlay; `lowers` are listed top first.

    Always nosuid and nodev: a sandbox's root makes setuid-root files and an image may carry device
    nodes, and on the host (where the files API and any host user who can reach the path see this
    mount) neither may take effect. Inside, commands have no_new_privs and a devices cgroup anyway.
    """
    extra = ",".join(f"{key}={value}" for key, value in _OVERLAY_OPTIONS.items())
    options = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={work},{extra}"
    if len(options) < _OPTION_PAGE:
        mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, options)
        return
    _mount_overlay_fsconfig(target, lowers, upper, work)


def _mount_overlay_fsconfig(target: str | Path, lowers: Sequence[str | Path], upper: str | Path,
                            work: str | Path) -> None:
    fs = _check(_libc.syscall(_SYS_FSOPEN, b"overlay", _FSOPEN_CLOEXEC), "fsopen overlay")
    try:
        def set_string(key: str, value: str) -> None:
            _check(_libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, key.encode(), value.encode(), 0),
                   f"fsconfig {key}")

        for lower in lowers:
            set_string("lowerdir+", str(lower))
        set_string("upperdir", str(upper))
        set_string("workdir", str(work))
        for key, value in _OVERLAY_OPTIONS.items():
            set_string(key, value)
        _check(_libc.syscall(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0), "fsconfig create")
        mnt = _check(_libc.syscall(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV),
                     "fsmount")
        try:
            _check(_libc.syscall(_SYS_MOVE_MOUNT, mnt, b"", -100, str(target).encode(), _MOVE_MOUNT_F_EMPTY_PATH),
                   "move_mount")
        finally:
            os.close(mnt)
    finally:
        os.close(fs)


def mounted_under(prefix: str | Path) -> list[str]:
    """Mount points at or below `prefix`, deepest first (the order to unmount them in).

    The mount table grows with the containers (two mounts each), so reading it grows slow, and every
    delete asks about a container's directory of a handful of entries: a small tree is walked first, and
    the table is read only when the walk finds a mount or the tree is large.
    """
    if _walked_unmounted(prefix):
        return []
    prefix = str(prefix).rstrip("/")
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def is_mount_point(path: str | Path) -> bool:
    """Whether `path` is the root of a mount, bind mounts of the same filesystem included."""
    return _statx(path)[1]


def _statx(path: str | Path) -> tuple[int, bool]:
    """The mode of `path` (not following a symlink) and whether it is a mount root: statx's
    STATX_ATTR_MOUNT_ROOT, or on kernels before 5.8, which lack it, a change of device."""
    buffer = ctypes.create_string_buffer(_STATX_SIZE)
    _check(_libc.statx(_AT_FDCWD, str(path).encode(), _AT_SYMLINK_NOFOLLOW | _AT_NO_AUTOMOUNT, 0, buffer),
           f"statx {path}")
    attributes, mode, known = _STATX_FIELDS.unpack_from(buffer)
    if not known & _STATX_ATTR_MOUNT_ROOT:
        return mode, os.path.ismount(path)
    return mode, bool(attributes & _STATX_ATTR_MOUNT_ROOT)


def _walked_unmounted(path: str | Path) -> bool:
    """True when a walk of at most WALK_BUDGET entries (no symlinks followed) covers the whole tree at
    `path` and finds no mount root in it; a path that does not exist holds nothing either."""
    pending = [str(path)]
    for _ in range(WALK_BUDGET):
        if not pending:
            return True
        entry = pending.pop()
        try:
            mode, mount_root = _statx(entry)
            if mount_root:
                return False
            if stat.S_ISDIR(mode):
                with os.scandir(entry) as entries:
                    pending.extend(inside.path for inside in entries)
        except (FileNotFoundError, NotADirectoryError):  # removed meanwhile: nothing mounted there
            continue
        except OSError:  # unreadable: the mount table decides
            return False
    return not pending
