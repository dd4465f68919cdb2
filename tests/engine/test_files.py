"""The files API: read, write, list, stat, exists, remove, mkdir, tar in and out, limits."""

from __future__ import annotations

import io
import tarfile

import pytest

from rollbox.engine import Container
from rollbox.errors import Conflict, FileNotFound, InvalidPath, TooLarge


def test_write_read_visible_inside_with_owner_and_mode(sandbox: Container) -> None:
    sandbox.files.write("src/app.py", "print('hi')\n", mode=0o755)
    assert sandbox.files.read("/home/user/src/app.py") == b"print('hi')\n"
    listing = sandbox.exec("stat -c '%U %a' src src/app.py && ./src/app.py || python3 src/app.py").stdout
    assert listing.splitlines()[:2] == ["user 755", "user 755"]


def test_writes_inside_are_visible_to_the_api(sandbox: Container) -> None:
    sandbox.exec("mkdir -p /tmp/d && echo data > /tmp/d/f && ln -s f /tmp/d/link")
    names = {info.name: info for info in sandbox.files.list("/tmp/d")}
    assert names["f"].type == "file" and names["f"].size == 5
    assert names["link"].type == "symlink" and names["link"].target == "f"
    assert sandbox.files.stat("/tmp/d").type == "dir"
    assert sandbox.files.exists("/tmp/d/f") and not sandbox.files.exists("/tmp/d/nope")


def test_remove_and_mkdir(sandbox: Container) -> None:
    sandbox.files.mkdir("a/b/c")
    sandbox.files.write("a/b/c/f", b"x")
    with pytest.raises(Conflict):
        sandbox.files.remove("a")
    sandbox.files.remove("a", recursive=True)
    assert not sandbox.files.exists("a")
    with pytest.raises(FileNotFound):
        sandbox.files.remove("a")
    with pytest.raises(FileNotFound):
        sandbox.files.read("missing.txt")


def test_baseline_files_can_be_replaced_but_not_lost(sandbox: Container) -> None:
    assert sandbox.files.read("/opt/data/file") == b"baseline\n"
    sandbox.files.write("/opt/data/file", "changed\n")
    assert sandbox.exec("cat /opt/data/file").stdout == "changed\n"


def test_tar_round_trip(sandbox: Container) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("pkg/a.txt", b"A"), ("pkg/sub/b.txt", b"BB")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("pkg/link")
        link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
        tar.addfile(link)
    assert sandbox.files.upload_tar("project", buffer.getvalue()) == 3
    assert sandbox.exec("cat project/pkg/link project/pkg/sub/b.txt").stdout == "ABB"
    with tarfile.open(fileobj=io.BytesIO(sandbox.files.download_tar("project"))) as tar:
        names = sorted(tar.getnames())
    assert names == ["pkg", "pkg/a.txt", "pkg/link", "pkg/sub", "pkg/sub/b.txt"]


def test_limits_and_bad_paths(sandbox: Container) -> None:
    with pytest.raises(TooLarge):
        sandbox.files.write("big", b"x" * (64 * 2**20 + 1))
    for bad in ("", "a\0b"):
        with pytest.raises(InvalidPath):
            sandbox.files.write(bad, b"x")
