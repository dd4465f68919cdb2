"""Removing a tree unmounts what is mounted inside it and never deletes through a mount.

A sandbox's directory is removed at every delete; `mounted_under` walks a tree that small (statx
says which entries are mount roots) instead of reading the host's mount table, which grows with the
sandboxes. A bind mount of the same filesystem has no device of its own, so these tests make one:
missing it would delete the files it shows, wherever they really live.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import mounts
from rollbox.engine.layers import remove_tree

MS_BIND = 0x1000


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory whose mounts are all gone after the test, whatever it left."""
    yield tmp_path
    for point in mounts.mounted_under(tmp_path):
        mounts.umount(point, lazy=True)


def bind(source: Path, target: Path) -> None:
    mounts.mount(str(source), target, None, MS_BIND)


def test_a_plain_tree_holds_no_mounts(scratch: Path) -> None:
    (scratch / "tree" / "a" / "b").mkdir(parents=True)
    (scratch / "tree" / "file").write_text("x")
    assert mounts.mounted_under(scratch / "tree") == []
    assert not mounts.is_mount_point(scratch / "tree")


def test_a_bind_mount_of_the_same_filesystem_is_found_and_its_files_survive(scratch: Path) -> None:
    precious = scratch / "elsewhere"
    precious.mkdir()
    (precious / "keep").write_text("kept")
    tree = scratch / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    bind(precious, tree / "a" / "b")

    assert mounts.is_mount_point(tree / "a" / "b")
    assert not mounts.is_mount_point(tree / "a")
    assert mounts.mounted_under(tree) == [str(tree / "a" / "b")]
    remove_tree(tree)

    assert not tree.exists()
    assert (precious / "keep").read_text() == "kept"
    assert mounts.mounted_under(scratch) == []


def test_nested_mounts_are_unmounted_deepest_first(scratch: Path) -> None:
    tree = scratch / "tree"
    (tree / "outer").mkdir(parents=True)
    mounts.mount_tmpfs(tree / "outer", 1 << 20)
    (tree / "outer" / "inner").mkdir()
    mounts.mount_tmpfs(tree / "outer" / "inner", 1 << 20)
    (tree / "outer" / "inner" / "file").write_text("x")

    assert mounts.mounted_under(tree) == [str(tree / "outer" / "inner"), str(tree / "outer")]
    remove_tree(tree)

    assert not tree.exists()
    assert mounts.mounted_under(scratch) == []


def test_a_symlink_to_a_mount_is_not_followed(scratch: Path) -> None:
    mounted = scratch / "mounted"
    mounted.mkdir()
    mounts.mount_tmpfs(mounted, 1 << 20)
    (mounted / "keep").write_text("kept")
    tree = scratch / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(mounted)

    assert mounts.mounted_under(tree) == []
    remove_tree(tree)

    assert not tree.exists()
    assert (mounted / "keep").read_text() == "kept"
    assert mounts.mounted_under(scratch) == [str(mounted)]


def test_a_mounted_tree_root_is_unmounted_before_removal(scratch: Path) -> None:
    tree = scratch / "tree"
    tree.mkdir()
    mounts.mount_tmpfs(tree, 1 << 20)
    (tree / "file").write_text("x")

    assert mounts.is_mount_point(tree)
    remove_tree(tree)

    assert not tree.exists()
    assert mounts.mounted_under(scratch) == []


def test_a_mount_deep_in_a_tree_too_large_to_walk_is_found(scratch: Path) -> None:
    tree = scratch / "tree"
    for index in range(mounts.WALK_BUDGET):
        (tree / f"d{index}").mkdir(parents=True)
    deep = tree / "z" / "y" / "x"
    deep.mkdir(parents=True)
    precious = scratch / "elsewhere"
    precious.mkdir()
    (precious / "keep").write_text("kept")
    bind(precious, deep)

    assert mounts.mounted_under(tree) == [str(deep)]
    remove_tree(tree)

    assert not tree.exists()
    assert (precious / "keep").read_text() == "kept"


def test_a_file_bind_mounted_in_a_tree_is_found(scratch: Path) -> None:
    source = scratch / "source"
    source.write_text("kept")
    tree = scratch / "tree"
    tree.mkdir()
    (tree / "target").write_text("")
    bind(source, tree / "target")

    assert mounts.mounted_under(tree) == [str(tree / "target")]
    remove_tree(tree)

    assert not tree.exists()
    assert source.read_text() == "kept"
