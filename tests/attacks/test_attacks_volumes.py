"""Attacks on named volumes: writing through a read-only mount, remounting or unmounting it, reaching another
volume or the loop devices behind them, links planted in a volume for the host-side files API, and filling one.

A volume is an ext4 image, loop-mounted on the host and bound into the sandbox (nosuid, nodev; read-only where
asked). Nothing a sandbox does may change a read-only volume, reach a volume it was not given (another tenant's
is only another image), or reach the host through one.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Container, Engine
from rollbox.engine.volumes import Volume
from rollbox.errors import Conflict, FileNotFound, RollboxError
from tests.attacks.attack_support import Host, Neighbour, template_name

CLIMB = "../" * 24


@contextlib.contextmanager
def _volume(engine: Engine, name: str) -> Iterator[Volume]:
    volume = engine.volumes.create(f"attacker/{name}", 16 * 2**20)
    try:
        yield volume
    finally:
        engine.delete_volume(volume.key)


@contextlib.contextmanager
def _mounted(engine: Engine, runtime: str, *mounts: tuple[Volume, str, bool]) -> Iterator[Container]:
    box = engine.create(template_name(runtime), volume_mounts=[(v.key, path, ro) for v, path, ro in mounts])
    try:
        yield box
    finally:
        box.delete()


def _digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.name == "lost+found":
            continue
        digest.update(str(path.relative_to(directory)).encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
        digest.update(oct(path.lstat().st_mode).encode())
    return digest.hexdigest()


@pytest.fixture
def dataset(attack_engine: Engine, request: pytest.FixtureRequest) -> Iterator[Volume]:
    """A volume holding a file and a directory, to be mounted read-only."""
    with _volume(attack_engine, f"dataset-{request.node.callspec.id if hasattr(request.node, 'callspec') else 'x'}"
                 ) as volume:
        root = attack_engine.volumes.path(volume)
        (root / "data").mkdir()
        (root / "data" / "train.jsonl").write_text('{"x": 1}\n')
        (root / "data" / "train.jsonl").chmod(0o666)
        (root / "data").chmod(0o777)
        yield volume


ATTEMPTS = [
    "echo evil > /data/data/train.jsonl",
    "echo evil >> /data/data/train.jsonl",
    "touch /data/new",
    "mkdir /data/dir",
    "rm -f /data/data/train.jsonl",
    "mv /data/data/train.jsonl /data/moved",
    "chmod 777 /data/data/train.jsonl",
    "chmod 700 /data/data",
    "truncate -s 0 /data/data/train.jsonl",
    "ln -s /etc/passwd /data/link",
    "ln /data/data/train.jsonl /data/hard",
    "setfattr -n user.x -v 1 /data/data/train.jsonl",
    "mount -o remount,rw /data",
    "mount -o remount,rw,bind /data",
    "umount /data && touch /data/new",
    "umount -l /data && touch /data/new",
    "mount --bind /tmp /data",
    "unshare -Urm sh -c 'mount -o remount,rw /data && echo evil > /data/data/train.jsonl'",
    "unshare -Urm sh -c 'mount -o remount,bind,rw /data && touch /data/new'",
    "unshare -Urm sh -c 'umount /data && touch /data/new'",
    "python3 -c \"import os; fd = os.open('/data/data/train.jsonl', os.O_RDWR); os.write(fd, b'evil')\"",
]


def test_a_read_only_volume_stays_unchanged(attack_engine: Engine, runtime_name: str, dataset: Volume,
                                            neighbour: Neighbour, host: Host) -> None:
    root = attack_engine.volumes.path(dataset)
    before = _digest(root)
    with _mounted(attack_engine, runtime_name, (dataset, "/data", True)) as box:
        for attempt in ATTEMPTS:
            box.exec(attempt, timeout=30)
            assert _digest(root) == before, f"{attempt!r} changed a read-only volume"
        assert box.exec("cat /data/data/train.jsonl", timeout=30).stdout == '{"x": 1}\n'
        with pytest.raises(Conflict):
            box.files.write("/data/data/train.jsonl", "evil")
        with pytest.raises(Conflict):
            box.files.upload_tar("/data", b"")
    assert _digest(root) == before
    neighbour.check()
    host.check()


def test_a_sandbox_reaches_no_other_volume_nor_the_loop_devices(attack_engine: Engine, runtime_name: str,
                                                                 neighbour: Neighbour, host: Host) -> None:
    with _volume(attack_engine, f"mine-{runtime_name}") as mine, \
            _volume(attack_engine, f"theirs-{runtime_name}") as theirs:
        secret = "another tenant's secret\n"
        (attack_engine.volumes.path(theirs) / "secret").write_text(secret)
        with _mounted(attack_engine, runtime_name, (mine, "/workspace", False)) as box:
            probes = [
                "cat /proc/self/mountinfo; cat /proc/mounts",
                "ls -la /dev; ls /dev/loop* 2>&1",
                "for n in 0 1 2 3 4 5 6 7; do mknod /tmp/loop$n b 7 $n && cat /tmp/loop$n | head -c 100000; done",
                "for n in 0 1 2 3 4 5 6 7; do mknod /workspace/loop$n b 7 $n && strings /workspace/loop$n; done",
                "strings /dev/loop0 /dev/loop1 /dev/loop2 /dev/loop3 2>&1",
                "find / -xdev -name secret 2>/dev/null; cat /workspace/../*/secret 2>&1",
                "mount -t ext4 /dev/loop0 /tmp 2>&1; ls /tmp",
                f"cat {attack_engine.volumes.path(theirs)}/secret 2>&1",
            ]
            for probe in probes:
                result = box.exec(probe, timeout=30)
                assert "another tenant" not in result.stdout + result.stderr, probe
            assert theirs.id not in box.exec("cat /proc/self/mountinfo", timeout=30).stdout
            with pytest.raises(RollboxError):
                box.files.read(f"/workspace/{CLIMB}{attack_engine.volumes.path(theirs).relative_to('/')}/secret")
        assert (attack_engine.volumes.path(theirs) / "secret").read_text() == secret
    neighbour.check()
    host.check()


def test_links_planted_in_a_volume_never_lead_the_files_api_out(attack_engine: Engine, runtime_name: str,
                                                                neighbour: Neighbour, host: Host) -> None:
    with _volume(attack_engine, f"links-{runtime_name}") as volume, \
            _mounted(attack_engine, runtime_name, (volume, "/workspace", False)) as box:
        targets = {"abs": str(host.directory), "rel": CLIMB + str(host.directory).lstrip("/"),
                   "file": str(host.secret_file), "relfile": CLIMB + str(host.secret_file).lstrip("/"),
                   "images": str(attack_engine.volumes.images), "root": "/"}
        for name, target in targets.items():
            assert box.exec(f"ln -sfn '{target}' /workspace/{name}", timeout=30).ok
        for name in targets:
            for path in (f"/workspace/{name}", f"/workspace/{name}/secret", f"/workspace/{name}/victim"):
                with contextlib.suppress(FileNotFound, RollboxError):
                    assert host.secret not in box.files.read(path)
                with contextlib.suppress(RollboxError):
                    box.files.write(f"{path}-planted", "planted")
                with contextlib.suppress(RollboxError):
                    box.files.write(path, "overwritten")
            with contextlib.suppress(RollboxError):
                listed = box.files.list(f"/workspace/{name}")
                assert "secret" not in {info.name for info in listed}
        # The volume's root is the API's root: nothing resolved outside the volume, on the host or in the sandbox.
        assert box.exec("cat /etc/hostname", timeout=30).ok
        with contextlib.suppress(RollboxError):
            box.files.remove("/workspace/root/etc", recursive=True)
        assert box.exec("test -f /etc/passwd", timeout=30).ok
    neighbour.check()
    host.check()


def test_filling_a_volume_harms_nothing_else(attack_engine: Engine, runtime_name: str, neighbour: Neighbour,
                                             host: Host) -> None:
    with _volume(attack_engine, f"fill-{runtime_name}") as volume, \
            _volume(attack_engine, f"beside-{runtime_name}") as beside, \
            _mounted(attack_engine, runtime_name, (volume, "/workspace", False)) as box:
        result = box.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; "
                          "for i in $(seq 2000); do echo x > /workspace/f$i || break; done; df -k /workspace",
                          timeout=120)
        assert "No space left on device" in result.stdout
        assert attack_engine.volumes.used(volume) <= volume.size
        assert attack_engine.volumes.used(beside) < 2**20
        (attack_engine.volumes.path(beside) / "ok").write_text("still writable")
        assert box.exec("echo fine > /home/user/after && cat /home/user/after", timeout=30).stdout == "fine\n"
    neighbour.check()
    host.check()
