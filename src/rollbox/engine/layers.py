"""Root filesystem layers: read-only lowers shared by many sandboxes, and per-sandbox uppers.

- A built layer lives on disk under `layers/<id>`, named by the hash of what made it.
- An upper lives in its own size-limited tmpfs under `uppers/<id>` (`upper/` and `work/`): the
  tmpfs size is the sandbox's disk limit. Fork and snapshot freeze an upper into a layer in place
  (`promote`), so their cost does not depend on how much the sandbox wrote.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from rollbox.engine import mounts

UPPER_PREFIX = "u-"
SKELETON = "skeleton-4"
"""Holds the mount points the engine adds to every sandbox, so runtimes never write them to an upper."""


class LayerStore:
    def __init__(self, root: Path) -> None:
        self.layers = root / "layers"
        self.uppers = root / "uppers"
        self.layers.mkdir(parents=True, exist_ok=True)
        self.uppers.mkdir(parents=True, exist_ok=True)
        self._ensure_skeleton()

    def _ensure_skeleton(self) -> None:
        path = self.layers / SKELETON
        if path.exists():
            return
        partial = self.staging(SKELETON)
        (partial / ".rollbox" / "run").mkdir(parents=True)
        (partial / ".rollbox" / "root").mkdir()
        (partial / ".rollbox" / "agent").touch()
        (partial / ".rollbox" / "compat.so").touch()
        (partial / "tmp").mkdir(mode=0o1777)
        (partial / "tmp").chmod(0o1777)  # every sandbox gets a /tmp, even from images without one
        self.commit(SKELETON, partial)

    def path(self, layer_id: str) -> Path:
        if layer_id.startswith(UPPER_PREFIX):
            return self.uppers / layer_id / "upper"
        return self.layers / layer_id

    def exists(self, layer_id: str) -> bool:
        return self.path(layer_id).is_dir()

    def staging(self, layer_id: str) -> Path:
        """An empty directory to fill before `commit` makes it the layer `layer_id`."""
        partial = self.layers / f".partial-{layer_id}-{secrets.token_hex(4)}"
        partial.mkdir(parents=True)
        return partial

    def commit(self, layer_id: str, staged: Path) -> None:
        try:
            staged.rename(self.layers / layer_id)
        except OSError:
            if not self.exists(layer_id):
                raise
            remove_tree(staged)  # another build made the same layer first

    @staticmethod
    def new_upper_id() -> str:
        return UPPER_PREFIX + secrets.token_hex(8)

    def create_upper(self, upper_id: str, size: int, seed: Path | None = None) -> None:
        """Creates the upper `upper_id`, holding a copy of the upper directory `seed` if given (overlayfs'
        whiteouts and opaque-directory xattrs included); record it first, or a concurrent clean-up may take it
        for garbage."""
        root = self.uppers / upper_id
        root.mkdir()
        mounts.mount_tmpfs(root, size)
        (root / "work").mkdir()
        if seed is None:
            (root / "upper").mkdir()
        else:
            copied = subprocess.run(["cp", "-a", "--", str(seed), str(root / "upper")], capture_output=True, text=True)
            if copied.returncode != 0:
                raise OSError(f"copying the files of {seed.parent.name} failed: {copied.stderr.strip()}")

    def upper_bytes(self, upper_id: str) -> int:
        """Bytes a sandbox has written (its upper's tmpfs in use)."""
        stats = os.statvfs(self.uppers / upper_id)
        return (stats.f_blocks - stats.f_bfree) * stats.f_frsize

    def upper_dirs(self, upper_id: str) -> tuple[Path, Path]:
        root = self.uppers / upper_id
        return root / "upper", root / "work"

    def promote(self, upper_id: str) -> str:
        """Turns an upper no overlay uses any more into a read-only layer with the same id."""
        _, work = self.upper_dirs(upper_id)
        remove_tree(work)
        return upper_id

    def remove(self, layer_id: str) -> None:
        if layer_id.startswith(UPPER_PREFIX):
            root = self.uppers / layer_id
            mounts.umount(root)
            with contextlib.suppress(FileNotFoundError):
                root.rmdir()
        elif layer_id != SKELETON:
            remove_tree(self.layers / layer_id)

    def all_ids(self) -> set[str]:
        found = {p.name for p in self.layers.iterdir() if not p.name.startswith(".")}
        return found | {p.name for p in self.uppers.iterdir()}

    def stack_paths(self, layer_ids: Sequence[str]) -> list[Path]:
        return [self.path(layer_id) for layer_id in layer_ids]


def remove_tree(path: Path) -> None:
    """Removes a directory tree, unmounting anything still mounted inside it first."""
    if not path.exists() and not path.is_symlink():
        return
    for point in mounts.mounted_under(path):
        mounts.umount(point)
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        # Leftovers are usually immutable bits or busy mounts: say so instead of hiding them.
        os.rmdir(path)
