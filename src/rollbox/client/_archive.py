"""Tar archives for moving whole directories in one request each way."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


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
