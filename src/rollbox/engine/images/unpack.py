"""Unpacks one OCI layer into a directory that overlayfs stacks as it is.

An image is data from outside: the blob is hashed as it is read (its digest, then the uncompressed
digest its config names) and nothing written is kept unless both match. Every member must land inside
the layer: absolute paths, `..`, and paths or hard links through a link that leaves the layer are
refused. OCI whiteouts become overlayfs' own: `.wh.NAME` a 0/0 character device, `.wh..wh..opq` the
opaque attribute on its directory. Device nodes are dropped (every sandbox gets its own /dev), and of
extended attributes only `user.*` ones are kept: `trusted.overlay.*` from an image could steer the
overlay itself.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import zlib
from pathlib import Path
from typing import IO, Any

from rollbox.errors import ImageRefused

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"
CHUNK = 1 << 20
_GZIP, _ZSTD = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_KEPT_XATTRS = "SCHILY.xattr.user."


class _Hashed(io.RawIOBase):
    """A reader that hashes what passes through it and counts it, up to a cap."""

    def __init__(self, source: IO[bytes], cap: int) -> None:
        self.source = source
        self.digest = hashlib.sha256()
        self.size = 0
        self.cap = cap

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        self.digest.update(data)
        self.size += len(data)
        if self.size > self.cap:
            raise ImageRefused(f"a layer unpacks to more than {self.cap} bytes, this node's cap: refused")
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(CHUNK):
            pass

    def hexdigest(self) -> str:
        return "sha256:" + self.digest.hexdigest()


def unpack_layer(blob: Path, digest: str, diff_id: str, dest: Path, max_bytes: int) -> None:
    """Unpacks the layer `blob` into the empty directory `dest`; ImageRefused when its bytes are not what
    `digest` and `diff_id` say, or a member would leave `dest`."""
    broken = None
    with open(blob, "rb") as raw:
        compressed = _Hashed(raw, max_bytes)
        head = raw.peek(4)[:4]
        plain = _Hashed(_decompressed(io.BufferedReader(compressed, CHUNK), head), max_bytes)
        try:
            with tarfile.open(fileobj=io.BufferedReader(plain, CHUNK), mode="r|", errorlevel=2) as tar:
                for member in tar:
                    _extract(tar, member, dest)
            plain.drain()
        except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as error:
            broken = error
        compressed.drain()
    if compressed.hexdigest() != digest:
        raise ImageRefused(f"layer {digest}: the bytes received hash to {compressed.hexdigest()}: refused (tampered "
                           "with, or broken in transit); nothing of it is kept")
    if broken is not None:
        raise ImageRefused(f"layer {digest} is not a readable tar archive ({broken}): refused")
    if plain.hexdigest() != diff_id:
        raise ImageRefused(f"layer {digest} unpacks to {plain.hexdigest()}, not the {diff_id} the image's config "
                           "names: refused")


def _decompressed(stream: IO[bytes], head: bytes) -> IO[bytes]:
    if head.startswith(_GZIP):
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if head.startswith(_ZSTD):
        import zstandard  # only images that use it need it

        return zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
    return stream


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    name = _inside(member.name, dest, member.name)
    base = os.path.basename(name)
    if base == OPAQUE:
        parent = dest / os.path.dirname(name)
        parent.mkdir(parents=True, exist_ok=True)
        os.setxattr(parent, OPAQUE_XATTR, b"y", follow_symlinks=False)
        return
    if base.startswith(WHITEOUT):
        target = dest / os.path.dirname(name) / base[len(WHITEOUT):]
        _inside(str(target.relative_to(dest)), dest, member.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            return  # the layer's own entry of that name wins over its whiteout
        os.mknod(target, stat.S_IFCHR, os.makedev(0, 0))
        return
    if member.ischr() or member.isblk():
        return
    if member.islnk():
        _inside(member.linkname, dest, member.name)
    tar.extract(member, dest, numeric_owner=True, filter=_as_is)
    for key, value in member.pax_headers.items():
        if key.startswith(_KEPT_XATTRS):
            os.setxattr(dest / name, key[len("SCHILY.xattr."):], value.encode("utf-8", "surrogateescape"),
                        follow_symlinks=False)


def _inside(name: str, dest: Path, member: str) -> str:
    """`name` relative to `dest`, once it is certain that it, and every link on the way, stays inside."""
    relative = name.lstrip("/")
    if not relative or relative in (".", "./"):
        relative = "."
    root = os.path.realpath(dest)
    resolved = os.path.realpath(os.path.join(root, relative))
    if os.path.commonpath([resolved, root]) != root:
        raise ImageRefused(f"layer member {member!r} would be written outside the image (at {resolved}): refused")
    return os.path.normpath(relative)


def _as_is(member: tarfile.TarInfo, _: str) -> tarfile.TarInfo:
    """Keeps owner and mode bits exactly (setuid files included: no_new_privs makes them inert in a sandbox). The
    paths were checked by `_inside`; a hard link's target is made relative too, or tarfile would join an absolute
    one onto nothing and link a file of this machine."""
    if member.islnk():
        return member.replace(name=member.name.lstrip("/"), linkname=member.linkname.lstrip("/"), deep=False)
    return member.replace(name=member.name.lstrip("/"), deep=False)
