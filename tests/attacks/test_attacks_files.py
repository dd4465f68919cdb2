"""Attacks through the host-side files API: `..`, symlinks out, symlinks swapped in mid-call, tar-slip.

The files API runs on the host as root, on the sandbox's root filesystem as the host sees it. The
sandbox controls every name in that tree, so it plants links to a host directory (holding a secret
and a victim file) and to the neighbour's files, by absolute and by climbing relative paths, and
races a directory against such a link while the host reads and writes through it. Nothing outside
the sandbox's root may ever be read, written, created or removed.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rollbox.engine import Container, Engine
from rollbox.engine.descriptors import MAX_DEPTH
from rollbox.errors import InvalidPath, InvalidRequest, RollboxError
from rollbox.models import FileInfo
from tests.attacks.attack_support import Host, Neighbour

CLIMB = "../" * 24
"""More `..` than any sandbox root is deep on the host."""


def _outside(engine: Engine, host: Host, neighbour: Neighbour) -> dict[str, str]:
    """Link targets out of the sandbox: the host directory and the neighbour's home, absolute and relative."""
    neighbour_home = engine.launcher.rootfs(neighbour.sandbox.id) / "home" / "user"
    return {"abs": str(host.directory), "rel": CLIMB + str(host.directory).lstrip("/"),
            "nb": str(neighbour_home), "nbrel": CLIMB + str(neighbour_home).lstrip("/"),
            "absfile": str(host.secret_file), "relfile": CLIMB + str(host.secret_file).lstrip("/")}


def _attempt(call: object, *args: object) -> object:
    """Runs one files API call; any refusal is fine, what matters is what reaches the host."""
    try:
        return call(*args)  # type: ignore[operator]
    except (RollboxError, OSError) as error:
        return error


def _check_outside(host: Host, neighbour: Neighbour, engine: Engine) -> None:
    host.check()
    neighbour.check()
    names = set(os.listdir(engine.launcher.rootfs(neighbour.sandbox.id) / "home" / "user"))
    assert names <= {"canary", ".bashrc", ".profile", ".bash_logout"}, f"files appeared in the neighbour: {names}"


def test_dotdot_paths_stay_inside(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host) -> None:
    """Paths that climb with `..` are clamped at the sandbox's root: the host's files are never reached."""
    files = box.files
    secret = CLIMB + str(host.secret_file).lstrip("/")
    for path in (secret, "/" + secret, f"/home/user/{secret}", f"/..{host.secret_file}"):
        result = _attempt(files.read, path)
        assert not isinstance(result, bytes) or host.secret not in result
    assert files.read("/../../../../etc/hostname") == b"sandbox\n"  # the sandbox's own /etc
    assert files.read(CLIMB + "etc/shadow") == b""
    names = {info.name for info in files.list(CLIMB)}
    assert ".rollbox" in names and "pytest-of-root" not in names
    written = f"{CLIMB}{str(host.directory).lstrip('/')}/written"
    files.write(written, b"inside")
    assert box.exec(f"cat {host.directory}/written").stdout == "inside"  # landed in the sandbox's /tmp
    _attempt(files.remove, f"{CLIMB}{str(host.directory).lstrip('/')}/victim")
    _attempt(files.mkdir, f"{CLIMB}{str(host.directory).lstrip('/')}/made")
    _attempt(files.symlink, f"{CLIMB}{str(host.directory).lstrip('/')}/link", "/")
    _check_outside(host, neighbour, attack_engine)


def test_symlinks_pointing_out(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host) -> None:
    """Absolute and relative links to host and neighbour paths resolve inside the sandbox, for every call."""
    links = _outside(attack_engine, host, neighbour)
    made = box.exec("; ".join(f"ln -s '{target}' /home/user/{name}" for name, target in links.items()))
    assert made.exit_code == 0, made
    files = box.files
    for name in links:
        for path in (name, f"{name}/secret", f"{name}/canary"):
            content = _attempt(files.read, path)
            assert not isinstance(content, bytes) or (host.secret not in content and
                                                      neighbour.token.encode() not in content), (path, content)
            listing = _attempt(files.list, path)
            if isinstance(listing, list):
                assert not {info.name for info in listing} & {"secret", "victim", "canary"}, (path, listing)
            info = _attempt(files.stat, path)
            assert not isinstance(info, FileInfo) or info.type == "symlink" or info.size != len(host.secret), info
        for child in ("new", "victim/new", "canary", "sub/deeper/file"):
            _attempt(files.write, f"{name}/{child}", b"pwned")
            _attempt(files.mkdir, f"{name}/dir-{child}")
            _attempt(files.symlink, f"{name}/link-{child.replace('/', '-')}", "/")
        for child in ("victim", "secret", "canary"):
            _attempt(files.remove, f"{name}/{child}")
        _attempt(files.remove, name, True)
    with tarfile.open(fileobj=io.BytesIO(files.download_tar("/home/user"))) as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member) if member.isfile() else None
            data = extracted.read() if extracted else b""
            assert host.secret not in data and neighbour.token.encode() not in data, member.name
    # A link to a file, written through: the link is replaced inside the sandbox, the target is untouched.
    box.exec(f"ln -sf '{host.secret_file}' /home/user/target")
    files.write("target", b"replaced")
    assert files.stat("target").type == "file"
    _check_outside(host, neighbour, attack_engine)


RACE_SETUP = """python3 - <<'EOF'
import os
home = "/home/user"
for name in ("race", "real"):
    os.makedirs(f"{home}/{name}", exist_ok=True)
    with open(f"{home}/{name}/secret", "w") as handle:
        handle.write("inside")
os.makedirs("DECOY", exist_ok=True)            # the host directory's path, recreated in the sandbox
with open("DECOY/secret", "w") as handle:
    handle.write("decoy")
for name, target in (("link-abs", "DECOY"), ("link-rel", "RELATIVE"), ("flip", "real")):
    os.symlink(target, f"{home}/{name}")
EOF"""
RACE = """python3 - <<'EOF'
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
home = "/home/user"
def exchange(a, b):  # renameat2(RENAME_EXCHANGE): swaps a directory and a link, neither ever missing
    return libc.syscall(316, -100, f"{home}/{a}".encode(), -100, f"{home}/{b}".encode(), 2) == 0
def point(target):  # "flip" is always a link: retarget it atomically by renaming a new link over it
    os.symlink(target, f"{home}/flip.new")
    os.rename(f"{home}/flip.new", f"{home}/flip")
can_exchange = exchange("race", "link-abs") and exchange("race", "link-abs")  # gVisor: no RENAME_EXCHANGE
end, swaps = time.monotonic() + SECONDS, 0
while time.monotonic() < end:
    for name in ("link-abs", "link-rel"):
        if can_exchange:
            exchange("race", name)   # "race" is now a link out
            exchange("race", name)   # and the real directory again
        point(os.readlink(f"{home}/{name}"))
        point("real")
        swaps += 1
print(swaps)
EOF"""


def test_symlink_swapped_in_mid_call(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host,
                                     runtime_name: str) -> None:
    """While the sandbox swaps directories and links out in a loop, the host reads and writes through them.

    `race` is exchanged between a real directory and a link (where the kernel has RENAME_EXCHANGE),
    `flip` is a link retargeted between a real directory and links out. The host's path to the
    secret, resolved on the host instead of in the sandbox's root, would read the host's secret; in
    the root, it reads the sandbox's decoy at the same path.
    """
    seconds = 3.0
    setup = RACE_SETUP.replace("DECOY", str(host.directory)).replace("RELATIVE", CLIMB + str(host.directory)[1:])
    assert box.exec(setup).exit_code == 0
    race = RACE.replace("SECONDS", str(seconds))
    files = box.files
    seen: dict[str, int] = {}
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        member = tarfile.TarInfo("pwned-by-tar")
        member.size = 5
        tar.addfile(member, io.BytesIO(b"pwned"))
    operations = [(f"{name}:{label}", call, name) for name in ("race", "flip") for label, call in (
        ("read", lambda d: files.read(f"{d}/secret")),
        ("write", lambda d: files.write(f"{d}/pwned", b"pwned")),
        ("mkdir", lambda d: files.mkdir(f"{d}/pwned-dir/sub")),
        ("remove", lambda d: files.remove(f"{d}/victim")),
        ("remove-tree", lambda d: files.remove(f"{d}/pwned-dir", recursive=True)),
        ("list", lambda d: files.list(d)),
        ("stat", lambda d: files.stat(f"{d}/secret")),
        ("download", lambda d: files.download_tar(d)),
        ("upload", lambda d: files.upload_tar(d, archive.getvalue())),
        ("symlink", lambda d: files.symlink(f"{d}/pwned-link", "/")),
    )]
    with ThreadPoolExecutor(1) as pool:
        swapper = pool.submit(box.exec, race, timeout=seconds + 60)
        started = time.monotonic()
        while not swapper.done() and time.monotonic() - started < seconds + 30:
            for name, operation, directory in operations:
                outcome = _attempt(operation, directory)
                if isinstance(outcome, bytes):
                    assert host.secret not in outcome, f"{name} returned the host's secret"
                    key = f"{name}:{outcome.decode(errors='replace')}" if name.endswith("read") else name
                elif isinstance(outcome, list):
                    assert not {info.name for info in outcome} & {"victim"}, f"{name} listed the host directory"
                    key = name
                else:
                    key = f"{name}:{type(outcome).__name__}"
                seen[key] = seen.get(key, 0) + 1
        swaps = swapper.result(timeout=60)
    assert int(swaps.stdout) > 10, swaps
    # The race really happened: reads went through the real directories and through the links out.
    for name in ("race", "flip") if runtime_name == "runc" else ("flip",):
        assert seen.get(f"{name}:read:inside", 0) > 0 and seen.get(f"{name}:read:decoy", 0) > 0, seen
    _check_outside(host, neighbour, attack_engine)


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member, data in members:
            if data is not None:
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, link
    return member


def test_tar_slip(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host) -> None:
    """Tar entries with `..`, absolute names, links then writes through them, hard links and devices."""
    outside = _outside(attack_engine, host, neighbour)
    climbing = _tar((_entry(f"{CLIMB}{str(host.directory).lstrip('/')}/slip"), b"pwned"))
    with pytest.raises(InvalidPath):
        box.files.upload_tar("uploads", climbing)
    with pytest.raises(InvalidPath):
        box.files.upload_tar("uploads", _tar((_entry("ok/../../../escape"), b"pwned")))
    # An absolute name lands under the upload directory, inside the sandbox.
    assert box.files.upload_tar("uploads", _tar((_entry(f"{host.directory}/absolute"), b"inside"))) == 1
    assert box.files.read(f"uploads{host.directory}/absolute") == b"inside"
    # A link out, then entries written through it: every write resolves inside the sandbox.
    for name in ("abs", "rel", "nb", "nbrel"):
        archive = _tar((_entry(name, tarfile.SYMTYPE, outside[name]), None),
                       (_entry(f"{name}/pwned"), b"pwned"), (_entry(f"{name}/canary"), b"pwned"),
                       (_entry(f"{name}/dir", tarfile.DIRTYPE), None), (_entry(f"{name}/dir/deeper"), b"pwned"))
        _attempt(box.files.upload_tar, "slip", archive)
        _attempt(box.files.upload_tar, "/", archive)
    # A link to a file, then a file of the same name: the link is replaced, its target untouched.
    _attempt(box.files.upload_tar, "slip2", _tar((_entry("f", tarfile.SYMTYPE, outside["absfile"]), None),
                                                (_entry("f"), b"pwned")))
    for refused in (_entry("hard", tarfile.LNKTYPE, str(host.secret_file)), _entry("dev", tarfile.CHRTYPE),
                    _entry("fifo", tarfile.FIFOTYPE)):
        with pytest.raises(InvalidRequest):
            box.files.upload_tar("refused", _tar((refused, None)))
    assert box.files.list("refused") == []
    _check_outside(host, neighbour, attack_engine)


def test_device_node_in_the_root_filesystem(attack_engine: Engine, box: Container) -> None:
    """A device node in a sandbox's files (as an image layer may carry) must not open through the files API.

    The node is planted from the host into the sandbox's upper (no command can make one): the files
    API, running as host root, must not open it, or a node for the host's disk would read the disk.
    """
    record = attack_engine.store.container(box.id)
    assert record is not None
    upper, _ = attack_engine.layers.upper_dirs(record.upper)
    (upper / "home" / "user").mkdir(parents=True, exist_ok=True)
    node = upper / "home" / "user" / "null-device"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null: harmless if it ever opened
    with contextlib.suppress(OSError):  # the overlay may cache the directory: look it up afresh
        os.stat(attack_engine.launcher.rootfs(box.id) / "home" / "user" / "null-device")
    with pytest.raises(RollboxError):
        box.files.read("null-device")
    with tarfile.open(fileobj=io.BytesIO(box.files.download_tar("/home/user"))) as tar:
        assert all(member.name != "null-device" or not member.isfile() for member in tar.getmembers())


def test_fifo_does_not_hang_the_host(attack_engine: Engine, box: Container) -> None:
    """A named pipe where the host expects a file must not block the engine's read forever.

    Under gVisor the pipe lives in the sentry and the host never sees it; under runc it is a real
    FIFO in the upper: files.read must refuse it at once instead of blocking on it.
    """
    made = box.exec("mkfifo /home/user/pipe && echo made")
    assert made.stdout == "made\n", made
    outcome: list[object] = []
    reader = threading.Thread(target=lambda: outcome.append(_attempt(box.files.read, "pipe")), daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock the engine's thread before failing
        pipe = attack_engine.launcher.rootfs(box.id) / "home" / "user" / "pipe"
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
        raise AssertionError("files.read blocked on a FIFO planted by the sandbox")
    assert outcome and not isinstance(outcome[0], bytes), outcome


FIFO_SWAP = """python3 - <<'EOF'
import os, time
os.makedirs("/home/user/swap", exist_ok=True)
end, swaps = time.monotonic() + SECONDS, 0
while time.monotonic() < end:
    os.mkfifo("/home/user/fifo.tmp")
    os.rename("/home/user/fifo.tmp", "/home/user/swap/file")     # a FIFO where a file was
    with open("/home/user/file.tmp", "w") as handle:
        handle.write("file")
    os.rename("/home/user/file.tmp", "/home/user/swap/file")     # and a regular file again
    swaps += 1
print(swaps)
EOF"""


def test_fifo_swapped_in_during_download(box: Container) -> None:
    """A file swapped for a FIFO between the host's stat and its open must not hang download_tar."""
    seconds = 3.0
    calls: list[object] = []

    def download() -> None:
        while len(calls) < 100_000 and not stop.is_set():
            calls.append(_attempt(box.files.download_tar, "/home/user/swap"))

    stop = threading.Event()
    box.exec("mkdir -p /home/user/swap && echo file > /home/user/swap/file")
    with ThreadPoolExecutor(1) as pool:
        swapper = pool.submit(box.exec, FIFO_SWAP.replace("SECONDS", str(seconds)), timeout=seconds + 60)
        downloader = threading.Thread(target=download, daemon=True)
        downloader.start()
        swaps = swapper.result(timeout=120)
        stop.set()
        downloader.join(10)
    assert not downloader.is_alive(), "download_tar hung on a FIFO swapped in by the sandbox"
    assert int(swaps.stdout) > 10 and len(calls) > 10, (swaps, len(calls))


def test_tar_slip_on_the_trainers_side(tmp_path_factory: pytest.TempPathFactory) -> None:
    """download_dir unpacks what a sandbox made on the trainer's machine: nothing may land outside its directory.

    A sandbox controls every name and link in the archive (and can race its directory walk into
    emitting a link followed by entries beneath it), so the SDK's unpacking is attacked directly.
    """
    from rollbox import archives

    outside = tmp_path_factory.mktemp("trainer-home")
    (outside / "victim").write_text("victim")
    hostile = [
        (_entry("../escaped"), b"pwned"),
        (_entry(f"{outside}/absolute"), b"pwned"),
        (_entry("link", tarfile.SYMTYPE, str(outside)), None),
        (_entry("link/through-link"), b"pwned"),
        (_entry("rel", tarfile.SYMTYPE, "../" * 24 + str(outside).lstrip("/")), None),
        (_entry("rel/through-relative-link"), b"pwned"),
        (_entry("hard", tarfile.LNKTYPE, str(outside / "victim")), None),
        (_entry("victim-link", tarfile.SYMTYPE, str(outside / "victim")), None),
        (_entry("victim-link"), b"pwned"),
        (_entry("device", tarfile.CHRTYPE), None),
    ]
    for member, data in hostile:
        dest = tmp_path_factory.mktemp("download")
        with contextlib.suppress(tarfile.TarError, OSError):
            archives.unpack(_tar((_entry("link", tarfile.SYMTYPE, str(outside)), None), (member, data)), dest)
        assert sorted(os.listdir(outside)) == ["victim"], f"{member.name} wrote outside the download directory"
        assert (outside / "victim").read_text() == "victim", member.name
        assert not (dest.parent / "escaped").exists()
    setuid = _entry("tool")
    setuid.mode = 0o6755
    dest = tmp_path_factory.mktemp("download")
    archives.unpack(_tar((setuid, b"#!/bin/sh\n")), dest)
    assert (dest / "tool").stat().st_mode & 0o7000 == 0, "a setuid bit survived unpacking"


NEST = """python3 - <<'EOF'
import os
os.chdir("/home/user")
for top, depth in (("deep", DEPTH), ("deeper", DEPTH + 1)):
    os.mkdir(top)
    os.chdir(top)
    for _ in range(depth):
        os.mkdir("d")
        os.chdir("d")
    open("leaf", "w").write("leaf")
    os.chdir("/home/user")
print("nested")
EOF"""


def test_directories_nested_deeper_than_the_hosts_stack(box: Container) -> None:
    """A sandbox nests directories past Python's recursion limit and PATH_MAX: the host-side walks of
    download_tar and a recursive remove go to MAX_DEPTH levels and refuse a deeper tree with a clear
    error, never a crash of the server's call; the sandbox's own files stay as they were."""
    made = box.exec(NEST.replace("DEPTH", str(MAX_DEPTH)), timeout=60)
    assert made.stdout == "nested\n", made

    with tarfile.open(fileobj=io.BytesIO(box.files.download_tar("deep"))) as tar:
        names = tar.getnames()
    assert len(names) == MAX_DEPTH + 1
    assert max(names, key=len) == "/".join(["d"] * MAX_DEPTH + ["leaf"])

    for call in (box.files.download_tar, lambda path: box.files.remove(path, recursive=True)):
        with pytest.raises(InvalidRequest, match=f"more than {MAX_DEPTH} levels deep"):
            call("deeper")
    assert box.exec("find /home/user/deeper -name leaf | wc -l").stdout == "1\n"

    box.files.remove("deep", recursive=True)
    assert not box.files.exists("deep")
    assert box.exec("echo alive").stdout == "alive\n"
