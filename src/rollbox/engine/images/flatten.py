"""Keeps an image's stack within what overlayfs mounts: a deeper image has its lowest layers merged into one.

overlayfs stacks at most 500 lower directories, and a sandbox adds the engine's skeleton, template steps
and a layer per fork or snapshot on top of its image. Images past MAX_IMAGE_LAYERS (rare: builders cap
them near 127) keep their top layers as they are and get the rest merged, once, into a layer named by
what it merges.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

from rollbox.engine.images.unpack import OPAQUE_XATTR
from rollbox.engine.layers import LayerStore, remove_tree
from rollbox.errors import ImageRefused

MAX_IMAGE_LAYERS = 120
MERGED_PREFIX = "merged-"


def within_limits(store: LayerStore, stack: list[str]) -> list[str]:
    """`stack` (top first) as it is, or with its lowest layers merged so that it has MAX_IMAGE_LAYERS."""
    if len(stack) <= MAX_IMAGE_LAYERS:
        return stack
    keep, merged = stack[: MAX_IMAGE_LAYERS - 1], stack[MAX_IMAGE_LAYERS - 1:]
    layer_id = MERGED_PREFIX + hashlib.sha256(json.dumps(merged).encode()).hexdigest()[:32]
    if not store.exists(layer_id):
        staged = store.staging(layer_id)
        try:
            for layer in reversed(merged):
                _apply(store.path(layer), staged)
        except BaseException:
            remove_tree(staged)
            raise
        store.commit(layer_id, staged)
    return [*keep, layer_id]


def _apply(layer: Path, merged: Path) -> None:
    """Puts `layer` on top of `merged`, as overlayfs would show them, leaving no whiteout behind."""
    whiteouts, opaque = [], []
    for root, dirs, files in os.walk(layer):
        relative = Path(root).relative_to(layer)
        if relative != Path(".") and _is_opaque(Path(root)):
            opaque.append(relative)
        for name in (*dirs, *files):
            if _is_whiteout(Path(root) / name):
                whiteouts.append(relative / name)
    for path in [*whiteouts, *opaque]:
        target = merged / path
        if target.is_dir() and not target.is_symlink():
            remove_tree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    copied = subprocess.run(["cp", "-a", "--", f"{layer}/.", f"{merged}/"], capture_output=True, text=True)
    if copied.returncode != 0:
        raise ImageRefused(f"merging the lowest layers of a deep image failed: {copied.stderr.strip()}")
    for path in whiteouts:
        (merged / path).unlink()
    for path in opaque:
        os.removexattr(merged / path, OPAQUE_XATTR, follow_symlinks=False)


def _is_whiteout(path: Path) -> bool:
    info = path.lstat()
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False
