"""The `debian:<suite>` base (debootstrap); images, from a registry or this machine, are `rollbox.engine.images`'.

The base is one layer named by what determines its content (the suite, mirror and recipe), so building a
template again finds the layer and does no work. It is filled in a staging directory and committed whole,
so a crashed build leaves nothing half-made.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from rollbox.engine import mounts
from rollbox.engine.hostbase import HOSTS
from rollbox.engine.layers import LayerStore, remove_tree
from rollbox.engine.oci import PATH
from rollbox.engine.store import Image
from rollbox.errors import BuildFailed, InvalidResource

Progress = Callable[[str], None]

DEBIAN_RECIPE = "debian-base-1"
"""Bump when the debootstrap recipe changes, so existing Debian layers are rebuilt."""
VARIANT = "minbase"
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")
DEBOOTSTRAP_TIMEOUT = 1800.0
APT_DIR = Path("/etc/apt")
OS_RELEASE = Path("/etc/os-release")
OCI_KINDS = ("oci", "oci-archive", "docker-archive")
BASE_FORMS = ("host, debian:<suite>, docker://<registry>/<repository>:<tag> (or @sha256:<digest>), oci:<dir>[:tag], "
              "oci-archive:<file.tar> or docker-archive:<file.tar>")
_SUITE = re.compile(r"^[a-z][a-z0-9.-]*$")
_ONE_LINE_SOURCE = re.compile(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)")
_PER_PACKAGE = re.compile(r"^I: (?:(?:Retrieving|Validating) [a-z0-9][a-z0-9+.-]* \d\S*"
                          r"|(?:Extracting|Unpacking|Configuring) [a-z0-9][a-z0-9+.-]*\.\.\.)$")


# -- debian:<suite> ---------------------------------------------------------------------------


def debian_base(store: LayerStore, suite: str, say: Progress) -> Image:
    """A minimal Debian root filesystem made by debootstrap from the mirror this machine's apt uses."""
    if not _SUITE.match(suite):
        raise InvalidResource(f"base debian:{suite} needs a Debian suite name, e.g. debian:bookworm")
    if not (DEBOOTSTRAP_SCRIPTS / suite).exists():
        raise InvalidResource(f"debootstrap does not know the suite {suite!r}: use one listed in "
                              f"{DEBOOTSTRAP_SCRIPTS} (e.g. bookworm), or upgrade debootstrap")
    mirror = apt_mirror(suite)
    layer_id = "debian-" + _digest([DEBIAN_RECIPE, suite, mirror, VARIANT])[:24]
    if store.exists(layer_id):
        return _debian_image(layer_id)
    say(f"debootstrap {suite} ({VARIANT}) from {mirror}: a few minutes, once")
    staged = store.staging(layer_id)
    try:
        _debootstrap(staged, suite, mirror, say)
        _add_user(staged)
        _tidy_debian(staged)
    except BaseException:
        remove_tree(staged)
        raise
    store.commit(layer_id, staged)
    say(f"debian:{suite} is layer {layer_id}")
    return _debian_image(layer_id)


def _debian_image(layer_id: str) -> Image:
    return Image(layers=[layer_id], env={"PATH": PATH}, user="root", host_binds=False)


def apt_mirror(suite: str, apt_dir: Path = APT_DIR) -> str:
    """The Debian mirror this machine's apt uses: builds go where the machine is allowed to go.

    Prefers a source that serves `suite` itself, then one that serves the host's own release
    (the same mirror carries the other suites).
    """
    sources = list(_apt_sources(apt_dir))
    for wanted in (suite, _host_codename()):
        for uri, suites in sources:
            if wanted in suites:
                return uri
    raise InvalidResource(
        f"found no Debian mirror for {suite!r} in {apt_dir}/sources.list or {apt_dir}/sources.list.d/: "
        f"add an apt source for it (a `deb <mirror> {suite} main` line or a deb822 .sources entry)")


def _apt_sources(apt_dir: Path) -> Iterator[tuple[str, set[str]]]:
    """(URI, suites) of every enabled binary (`deb`) source, one-line and deb822 alike."""
    one_line = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in one_line:
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                match = _ONE_LINE_SOURCE.match(line.strip())
                if match:
                    yield match.group(1), {match.group(2)}
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for fields in _deb822(path.read_text(errors="replace")):
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                suites = set(fields.get("suites", "").split())
                for uri in fields.get("uris", "").split():
                    yield uri, suites


def _deb822(text: str) -> Iterator[dict[str, str]]:
    """The paragraphs of a deb822 file as lower-cased field -> value (continuation lines joined)."""
    fields: dict[str, str] = {}
    key = ""
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields:
                yield fields
            fields, key = {}, ""
        elif line[0] in " \t" and key:
            fields[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()


def _host_codename() -> str:
    if OS_RELEASE.is_file():
        for line in OS_RELEASE.read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.partition("=")[2].strip().strip('"')
    return ""


def _debootstrap(root: Path, suite: str, mirror: str, say: Progress) -> None:
    """Runs debootstrap into `root`, passing on its phases (not every package) as progress.

    It runs in its own process group, so a timeout or an interrupted build stops dpkg too, before
    the half-made tree is removed.
    """
    argv = ["debootstrap", f"--variant={VARIANT}", "--components=main", suite, str(root), mirror]
    tail: deque[str] = deque(maxlen=40)
    try:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   errors="replace", env={**os.environ, "LC_ALL": "C"}, start_new_session=True)
    except FileNotFoundError:
        raise BuildFailed("debootstrap is not installed: run scripts/setup.sh (or apt-get install debootstrap)") \
            from None
    watchdog = threading.Timer(DEBOOTSTRAP_TIMEOUT, os.killpg, (process.pid, signal.SIGKILL))
    watchdog.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip()
            tail.append(line)
            if line.startswith(("I: ", "W: ", "E: ")) and not _PER_PACKAGE.match(line):
                say(line)
        code = process.wait()
    finally:
        watchdog.cancel()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for point in mounts.mounted_under(root):  # debootstrap mounts /proc and /sys in the target
            mounts.umount(point)
    if code != 0:
        output = "\n".join(tail)
        how = f"was stopped after {DEBOOTSTRAP_TIMEOUT:.0f} s" if code == -signal.SIGKILL else f"failed ({code})"
        raise BuildFailed(f"debootstrap {suite} from {mirror} {how}; check that this machine reaches the mirror "
                          f"and that it carries {suite}:\n{output}", exit_code=code, output=output)


def _add_user(root: Path) -> None:
    """Adds the unprivileged `user` (uid and gid 1000, home /home/user) that sandboxes run as."""
    for argv in (["groupadd", "--gid", "1000", "user"],
                 ["useradd", "--uid", "1000", "--gid", "1000", "--create-home", "--shell", "/bin/bash", "user"]):
        done = subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildFailed(f"adding the sandbox user failed ({' '.join(argv)}): {done.stderr.strip()}",
                              exit_code=done.returncode, output=done.stderr)


def _tidy_debian(root: Path) -> None:
    """Drops what debootstrap leaves that a read-only lower layer should not carry.

    Device nodes go (every sandbox gets its own /dev), the host's name and resolver settings go,
    and apt's package lists and downloaded packages go (`apt-get update` fetches them again).
    """
    for entry in (root / "dev").iterdir():
        if entry.is_dir() and not entry.is_symlink():
            remove_tree(entry)
        else:
            entry.unlink()
    etc = root / "etc"
    (etc / "resolv.conf").unlink(missing_ok=True)
    (etc / "resolv.conf").write_text("")
    (etc / "hostname").write_text("sandbox\n")
    (etc / "hosts").write_text(HOSTS)
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb",
                    "var/cache/apt/archives/partial/*"):
        for path in root.glob(pattern):
            if path.is_file() and path.name != "lock":
                path.unlink()


def _digest(parts: list[str]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()
