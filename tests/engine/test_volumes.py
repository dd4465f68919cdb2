"""Named volumes in the engine: loop-mounted images bound into containers, sized, shared read-only, released."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine
from rollbox.engine.volumes import Volume
from rollbox.errors import Conflict, FileNotFound, InvalidRequest, VolumeInUse, VolumeNotFound
from rollbox.spec import SandboxTemplate
from tests.support.engines import template_for
from tests.support.volumes import loop_devices, mounted, wait_detached

MiB = 2**20


@pytest.fixture
def volume(engine: Engine, request: pytest.FixtureRequest) -> Iterator[Volume]:
    key = f"test/{request.node.name.replace('[', '-').rstrip(']').lower().replace('_', '-')[:50]}"
    volume = engine.volumes.create(key, 32 * MiB)
    yield volume
    for record in list(engine.list()):
        if any(attached["key"] == key for attached in engine.store.container(record.id).volumes):  # type: ignore[union-attr]
            engine.delete(record.id)
    engine.delete_volume(key)


def test_a_volume_is_an_image_of_its_size_mounted_once(engine: Engine, volume: Volume) -> None:
    image = engine.volumes.images / f"{volume.id}.img"
    path = engine.volumes.path(volume)
    assert image.stat().st_size == 32 * MiB
    assert image.stat().st_blocks * 512 < 32 * MiB  # sparse: host disk is taken as the volume fills
    assert str(path) in mounted()
    assert str(image) in loop_devices()
    assert 0 < engine.volumes.used(volume) < 4 * MiB
    with pytest.raises(VolumeInUse):
        engine.volumes.create(volume.key, 32 * MiB)
    with pytest.raises(InvalidRequest):
        engine.volumes.create("test/tiny", 4096)
    with pytest.raises(VolumeNotFound):
        engine.volumes.get("test/absent")


def test_files_outlive_containers_and_reset_and_are_shared_read_only(engine: Engine, runtime: str,
                                                                     volume: Volume) -> None:
    with engine.create(template_for(runtime), volume_mounts=[(volume.key, "/workspace", False)]) as writer:
        assert writer.exec("echo kept > /workspace/notes && id -u > /workspace/owner").ok
        writer.reset()
        assert writer.exec("cat /workspace/notes").stdout == "kept\n"
    assert (engine.volumes.path(volume) / "notes").read_text() == "kept\n"
    with engine.create(template_for(runtime), volume_mounts=[(volume.key, "/data", True)]) as reader, \
            engine.create(template_for(runtime), volume_mounts=[(volume.key, "/data", True)]) as other:
        for box in (reader, other):
            assert box.exec("cat /data/notes").stdout == "kept\n"
            assert not box.exec("echo x > /data/notes").ok
            assert not box.exec("touch /data/new").ok
            assert not box.exec("chmod 777 /data/notes").ok
        assert (engine.volumes.path(volume) / "notes").read_text() == "kept\n"
        assert not (engine.volumes.path(volume) / "new").exists()


def test_writing_past_the_size_fails_with_enospc_inside_and_harms_nothing_else(engine: Engine, volume: Volume) -> None:
    with engine.create(template_for("runc"), volume_mounts=[(volume.key, "/workspace", False)]) as box:
        filled = box.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; echo rc=$?", timeout=60)
        assert "No space left on device" in filled.stdout and "rc=1" in filled.stdout
        assert engine.volumes.used(volume) <= 32 * MiB
        # The sandbox's own disk and the host still take writes.
        assert box.exec("echo fine > /tmp/after && cat /tmp/after").stdout == "fine\n"
        assert box.exec("rm /workspace/fill && echo again > /workspace/again").ok


def test_a_fork_gives_its_children_the_volume_read_only(engine: Engine, volume: Volume) -> None:
    with engine.create(template_for("runc"), volume_mounts=[(volume.key, "/workspace", False)]) as parent:
        assert parent.exec("echo parent > /workspace/state").ok
        children = parent.fork(2)
        try:
            for child in children:
                assert child.exec("cat /workspace/state").stdout == "parent\n"
                assert not child.exec("echo child > /workspace/state").ok
            assert parent.exec("echo still > /workspace/state").ok
        finally:
            for child in children:
                child.delete()


def test_the_files_api_reaches_the_volume_and_never_out_of_it(engine: Engine, volume: Volume, tmp_path: Path) -> None:
    with engine.create(template_for("runc"), volume_mounts=[(volume.key, "/workspace", False)]) as box, \
            engine.create(template_for("runc"), volume_mounts=[(volume.key, "/ro", True)]) as reader:
        box.files.write("/workspace/from-api.txt", "api\n")
        assert box.exec("cat /workspace/from-api.txt").stdout == "api\n"
        assert box.exec("ln -s /etc/hostname /workspace/link && ln -s ../../../../../etc /workspace/up").ok
        # Resolved inside the volume's root: the links lead to the volume's own (absent) /etc, never the host's
        # nor the sandbox's.
        with pytest.raises(FileNotFound):
            box.files.read("/workspace/link")
        with pytest.raises(FileNotFound):
            box.files.read("/workspace/up/hostname")
        assert reader.files.read("/ro/from-api.txt") == b"api\n"
        with pytest.raises(Conflict):
            reader.files.write("/ro/x", "no")
        with pytest.raises(Conflict):
            reader.files.remove("/ro/from-api.txt")


def test_delete_waits_for_containers_and_releases_the_loop_device(engine: Engine) -> None:
    volume = engine.volumes.create("test/released", 16 * MiB)
    image = str(engine.volumes.images / f"{volume.id}.img")
    box = engine.create(template_for("runc"), volume_mounts=[(volume.key, "/workspace", False)])
    with pytest.raises(VolumeInUse):
        engine.volumes.delete(volume.key, lambda: [box.id], wait=0.1)
    box.delete()
    engine.delete_volume(volume.key)
    wait_detached(image)
    assert str(engine.volumes.path(volume)) not in mounted()
    assert not Path(image).exists() and not engine.volumes.path(volume).exists()


def test_creation_writes_little_whatever_the_size(engine: Engine) -> None:
    """What keeps making a volume fast at any size: its image is sparse and its filesystem made lazily."""
    volume = engine.volumes.create("test/large", 8 * 2**30)
    try:
        image = engine.volumes.images / f"{volume.id}.img"
        assert image.stat().st_size == 8 * 2**30
        assert image.stat().st_blocks * 512 < 256 * MiB, f"{image.stat().st_blocks * 512 / MiB:.0f} MiB written"
        usage = os.statvfs(engine.volumes.path(volume))
        assert usage.f_blocks * usage.f_frsize > 7 * 2**30  # the whole size is the tenant's
    finally:
        engine.delete_volume(volume.key)


def test_a_restarted_engine_mounts_its_volumes_again_and_removes_orphans(tmp_path: Path) -> None:
    from tests.support.engines import make_engine, teardown_engine

    engine = make_engine(tmp_path)
    volume = engine.volumes.create("test/durable", 16 * MiB)
    (engine.volumes.path(volume) / "kept").write_text("yes")
    orphan = engine.volumes.images / "deadbeefdeadbeef.img"
    subprocess.run(["truncate", "-s", "16M", str(orphan)], check=True)
    subprocess.run(["losetup", "-f", str(orphan)], check=True)
    partial = engine.volumes.images / "0123456789abcdef.partial"
    partial.write_bytes(b"half")
    engine.close()  # no container left: its volumes are unmounted, their loop devices freed
    image = str(engine.volumes.images / f"{volume.id}.img")
    assert str(engine.volumes.path(volume)) not in mounted()
    wait_detached(image)
    engine = Engine(engine.data_dir, run_dir=engine.run_dir)
    try:
        assert (engine.volumes.path(volume) / "kept").read_text() == "yes"
        assert image in loop_devices()
        assert not orphan.exists() and not partial.exists()
        wait_detached(str(orphan))
    finally:
        teardown_engine(engine)
    wait_detached(image)


def test_containers_keep_their_volumes_through_an_engine_restart_and_a_kill(tmp_path: Path) -> None:
    from tests.support.engines import make_engine, teardown_engine

    engine = make_engine(tmp_path)
    try:
        engine.build(SandboxTemplate.model_validate({"metadata": {"name": "plain"}}))
        volume = engine.volumes.create("test/adopted", 16 * MiB)
        kept = engine.create("plain", volume_mounts=[(volume.key, "/workspace", False)])
        killed = engine.create("plain", volume_mounts=[(volume.key, "/data", True)])
        assert kept.exec("echo before > /workspace/f").ok
        engine.close()  # containers stay: so does their volume's mount
        image = str(engine.volumes.images / f"{volume.id}.img")
        assert loop_devices().count(image) == 1
        subprocess.run(["runc", "--root", str(engine.data_dir / "runtime" / "runc"), "kill", f"{killed.id}.0", "KILL"],
                       check=True)
        engine = Engine(engine.data_dir, run_dir=engine.run_dir)
        assert loop_devices().count(image) == 1  # adopted, not attached twice
        assert engine.get(kept.id).exec("cat /workspace/f").stdout == "before\n"
        assert engine.get(killed.id).exec("cat /data/f").stdout == "before\n"  # restarted with its volume
        assert not engine.get(killed.id).exec("touch /data/g").ok
    finally:
        teardown_engine(engine)
    wait_detached(image)
