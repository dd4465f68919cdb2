"""Named volumes: one ext4 image per volume, loop-mounted on the host and bound into the containers that use it.

This kernel has no filesystem quotas, so a volume's size is the size of its own filesystem: a write past it fails
with ENOSPC inside that volume and touches nothing else. An image is created sparse (it takes host disk only as it
fills), made a filesystem with `mkfs.ext4` and mounted once, at `volumes/mnt/<id>`, for as long as the volume exists
and the engine runs; containers get a bind of that mount (read-only where asked). `mount -o loop` attaches the loop
device with autoclear, so unmounting the last reference frees it, and refuses a second loop device over an image
already attached (two filesystems over one image would corrupt it).

A volume is recorded (its own SQLite file, `volumes/volumes.db`) only once its image is whole, and forgotten before
its image goes: so after a crash, an image the store does not name is half made or half deleted, and goes.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollbox.engine import mounts
from rollbox.engine.database import Database
from rollbox.engine.files import ContainerFiles
from rollbox.engine.oci import Bind
from rollbox.errors import Conflict, InvalidRequest, RollboxError, VolumeInUse, VolumeNotFound

SCHEMA = """
CREATE TABLE IF NOT EXISTS volumes (
    key TEXT PRIMARY KEY, id TEXT NOT NULL, size INTEGER NOT NULL, created_at REAL NOT NULL);
"""
MIN_SIZE = 8 * 2**20
"""The smallest volume: ext4 needs a few megabytes of its own."""
MAX_SIZE = 16 * 2**40
MKFS = ("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0")
"""No blocks reserved for root (the whole size is the tenant's); inode tables and journal zeroed lazily, so making
the filesystem costs milliseconds whatever the size."""
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
WRITES = frozenset({"write", "remove", "mkdir", "upload_tar", "symlink"})
"""The `ContainerFiles` operations that change files: refused on a read-only mount."""


@dataclass
class Volume:
    key: str
    """The node's name for it (`<tenant>/<name>`)."""
    id: str
    """What names its image and mount point on the host."""
    size: int
    created_at: float


class Volumes:
    """The engine's volumes. Thread-safe (each call is a few syscalls and one SQLite transaction)."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "volumes"
        self.images = self.dir / "images"
        self.mounts = mount_dir(data_dir)
        for directory in (self.dir, self.images, self.mounts):
            directory.mkdir(mode=0o700, exist_ok=True)
        self.store = Database(self.dir / "volumes.db", SCHEMA, exclusive=True)

    # -- records -----------------------------------------------------------------------------

    def get(self, key: str) -> Volume:
        rows = self.store.query("SELECT key, id, size, created_at FROM volumes WHERE key=?", key)
        if not rows:
            raise VolumeNotFound(f"volume {key.rpartition('/')[2]!r} does not exist: create it first")
        return Volume(*rows[0])

    def list(self, prefix: str = "") -> list[Volume]:
        rows = self.store.query("SELECT key, id, size, created_at FROM volumes WHERE substr(key, 1, ?)=? ORDER BY key",
                                len(prefix), prefix)
        return [Volume(*row) for row in rows]

    def path(self, volume: Volume) -> Path:
        """The volume's files on the host (the mount of its image)."""
        return self.mounts / volume.id

    def used(self, volume: Volume) -> int:
        usage = os.statvfs(self.path(volume))
        return (usage.f_blocks - usage.f_bfree) * usage.f_frsize

    # -- lifecycle ---------------------------------------------------------------------------

    def create(self, key: str, size: int) -> Volume:
        """Makes and mounts a volume of `size` bytes. VolumeInUse (409) if `key` exists."""
        if not MIN_SIZE <= size <= MAX_SIZE:
            raise InvalidRequest(f"a volume's size must be between {MIN_SIZE >> 20} MiB and {MAX_SIZE >> 40} TiB")
        with contextlib.suppress(VolumeNotFound):
            self.get(key)
            raise VolumeInUse(f"volume {key.rpartition('/')[2]!r} exists already")
        volume = Volume(key, secrets.token_hex(8), size, time.time())
        partial = self.images / f"{volume.id}.partial"
        try:
            with open(partial, "wb") as image:
                image.truncate(size)
            _run([*MKFS, str(partial)], "make the volume's filesystem")
            partial.rename(self._image(volume))
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        try:
            with self.store.transaction() as db:
                db.execute("INSERT INTO volumes VALUES (?, ?, ?, ?)", (key, volume.id, size, volume.created_at))
        except Exception:
            self._image(volume).unlink(missing_ok=True)
            if self.get(key).id != volume.id:  # another call made it meanwhile
                raise VolumeInUse(f"volume {key.rpartition('/')[2]!r} exists already") from None
            raise
        self._mount(volume)
        return volume

    def delete(self, key: str, users: Callable[[], Iterable[str]], wait: float = 10.0) -> None:
        """Unmounts the volume, releasing its loop device, and removes its image. `users` names the containers
        that still bind it: they are waited for (a deleted sandbox's container goes in the background) for at most
        `wait` seconds, then VolumeInUse."""
        volume = self.get(key)
        deadline = time.monotonic() + wait
        while holding := list(users()):
            if time.monotonic() > deadline:
                raise VolumeInUse(f"volume {key.rpartition('/')[2]!r} is still mounted by {len(holding)} "
                                  "container(s) being removed: try again in a moment")
            time.sleep(0.05)
        mounts.umount(self.path(volume))
        with self.store.transaction() as db:
            db.execute("DELETE FROM volumes WHERE key=?", (key,))
        self._remove(volume.id)

    def recover(self) -> None:
        """Mounts every recorded volume not mounted yet, and removes what no record names (an image half made or
        half deleted, its mount and loop device)."""
        known = {volume.id: volume for volume in self.list()}
        for volume in known.values():
            target = self.path(volume)
            if not (target.exists() and mounts.is_mount_point(target)):
                self._mount(volume)
        for found in [*self.images.iterdir(), *self.mounts.iterdir()]:
            volume_id = found.name.split(".")[0]
            if volume_id not in known:
                self._remove(volume_id)

    def unmount_all(self) -> None:
        """Unmounts every volume (their loop devices go with them); `recover` mounts them again."""
        for target in self.mounts.iterdir():
            if mounts.is_mount_point(target):
                mounts.umount(target, lazy=True)

    def close(self) -> None:
        self.store.close()

    def _image(self, volume: Volume) -> Path:
        return self.images / f"{volume.id}.img"

    def _mount(self, volume: Volume) -> None:
        target = self.path(volume)
        target.mkdir(mode=0o700, exist_ok=True)
        _run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(self._image(volume)), str(target)],
             "mount the volume's image")
        # The sandbox's user differs between templates: every one of them may write (the volume is one tenant's).
        target.chmod(0o777)

    def _remove(self, volume_id: str) -> None:
        target = self.mounts / volume_id
        if target.exists() and mounts.is_mount_point(target):
            mounts.umount(target, lazy=True)
        with contextlib.suppress(FileNotFoundError):
            target.rmdir()
        for image in self.images.glob(f"{volume_id}.*"):
            _detach(image)
            image.unlink(missing_ok=True)


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RollboxError(f"could not {what}: {' '.join(argv[:1])} said {done.stderr.strip() or done.returncode}")


def _detach(image: Path) -> None:
    """Detaches any loop device still backing `image` (one a crash left attached without a mount)."""
    found = subprocess.run(["losetup", "-n", "-O", "NAME", "-j", str(image)], capture_output=True, text=True,
                           check=False)
    for device in found.stdout.split():
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


# -- containers ------------------------------------------------------------------------------------

def attachment(volume: Volume, destination: str, read_only: bool) -> dict[str, Any]:
    """How a container record keeps one of its volumes (the record is JSON)."""
    return {"key": volume.key, "id": volume.id, "destination": destination, "read_only": read_only}


def read_only(attachments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A fork's children mount their parent's volumes read-only: one writer at a time (docs/volumes.md)."""
    return [{**attached, "read_only": True} for attached in attachments]


def mount_dir(data_dir: Path) -> Path:
    """Where an engine on `data_dir` mounts its volumes, each at `<volume id>`."""
    return data_dir / "volumes" / "mnt"


def binds(data_dir: Path, attachments: list[dict[str, Any]]) -> list[Bind]:
    """The bind mounts of a container's volumes: each volume's mount, not recursive, nosuid and nodev."""
    return [Bind(str(mount_dir(data_dir) / attached["id"]), attached["destination"], readonly=attached["read_only"],
                 recursive=False) for attached in attachments]


def users(records: Iterable[Any], key: str) -> list[str]:
    """The containers (of `records`) that bind the volume `key`."""
    return [record.id for record in records if any(attached["key"] == key for attached in record.volumes)]


class MountedFiles:
    """A container's files as its processes see them: a path under a volume's mount goes to the volume's files on
    the host (resolved inside the volume, never out of it), anything else to the container's root. The files API
    reads the root from the host, where a volume's bind mount does not show."""

    def __init__(self, root: ContainerFiles, volumes: Volumes, attachments: list[dict[str, Any]]) -> None:
        self.root = root
        self.mounted = sorted(((attached["destination"], volumes.mounts / attached["id"], attached["read_only"])
                               for attached in attachments), key=lambda mounted: len(mounted[0]), reverse=True)

    def __getattr__(self, op: str) -> Callable[..., Any]:
        def call(path: str, *args: Any, **options: Any) -> Any:
            files, inside, read_only = self._route(path)
            if read_only and op in WRITES:
                raise Conflict(f"{path} is on a volume mounted read-only: it cannot be changed from this sandbox")
            return getattr(files, op)(inside, *args, **options)
        return call

    def _route(self, path: str) -> tuple[ContainerFiles, str, bool]:
        if not isinstance(path, str):
            return self.root, path, False
        absolute = posixpath.normpath(path if path.startswith("/") else posixpath.join(self.root.home, path))
        for destination, host, read_only in self.mounted:
            if absolute == destination or absolute.startswith(destination + "/"):
                inside = "/" + absolute[len(destination):].lstrip("/")
                return (ContainerFiles(str(host), "/", self.root.uid, self.root.gid, self.root.max_upload),
                        inside, read_only)
        return self.root, path, False
