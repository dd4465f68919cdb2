"""Bases other than `host`: `debian:<suite>` (debootstrap) and OCI images (layout or archive).

Each base is one layer named by what determines its content (the suite, mirror and recipe, or the
digests of the image's layers), so building a template again finds the layer and does no work. Layers
are filled in a staging directory and committed whole, so a crashed build leaves nothing half-made.
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
from typing import Any

from rollbox.engine import mounts
from rollbox.engine.hostbase import HOSTS
from rollbox.engine.layers import LayerStore, remove_tree
from rollbox.engine.oci import PATH
from rollbox.engine.store import Image
from rollbox.errors import BuildFailed, InvalidResource

Progress = Callable[[str], None]

DEBIAN_RECIPE = "debian-base-1"
"""Bump when the debootstrap recipe changes, so existing Debian layers are rebuilt."""
OCI_RECIPE = "oci-base-1"
VARIANT = "minbase"
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")
DEBOOTSTRAP_TIMEOUT = 1800.0
TOOL_TIMEOUT = 1800.0
APT_DIR = Path("/etc/apt")
OS_RELEASE = Path("/etc/os-release")
OCI_KINDS = ("oci", "oci-archive", "docker-archive")
BASE_FORMS = "host, debian:<suite>, oci:<dir>[:tag], oci-archive:<file.tar> or docker-archive:<file.tar>"
UNPACK_TAG = "rollbox"
MAKERS = {"oci": "`skopeo copy ... oci:<dir>:<tag>` or `umoci init`",
          "oci-archive": "`skopeo copy ... oci-archive:<file.tar>`",
          "docker-archive": "`docker save` or `skopeo copy ... docker-archive:<file.tar>`"}
_SUITE = re.compile(r"^[a-z][a-z0-9.-]*$")
_ONE_LINE_SOURCE = re.compile(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)")
_PER_PACKAGE = re.compile(r"^I: (?:(?:Retrieving|Validating) [a-z0-9][a-z0-9+.-]* \d\S*"
                          r"|(?:Extracting|Unpacking|Configuring) [a-z0-9][a-z0-9+.-]*\.\.\.)$")
_SKOPEO_MESSAGE = re.compile(r'msg="((?:[^"\\]|\\.)*)"')


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


# -- oci:<dir>[:tag], oci-archive:<file.tar>, docker-archive:<file.tar> -------------------------


def oci_base(store: LayerStore, kind: str, ref: str, say: Progress) -> Image:
    """An OCI image's root filesystem as one layer, with the image's env, workdir and user."""
    if kind not in OCI_KINDS:
        raise InvalidResource(f"unknown base {f'{kind}:{ref}'.rstrip(':')!r}: use {BASE_FORMS}")
    source = f"{kind}:{ref}"
    _check_source(kind, ref)
    config = json.loads(_inspect_config(store, kind, ref))
    settings: dict[str, Any] = config.get("config") or {}
    workdir = settings.get("WorkingDir") or None
    # Named by the uncompressed layer digests (which umoci verifies while unpacking), not the manifest:
    # the same image as a layout, an oci-archive or a docker-archive, or retagged with other settings,
    # is unpacked once.
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    layer_id = "oci-" + _digest([OCI_RECIPE, *diff_ids, workdir or ""])[:24]
    if not store.exists(layer_id):
        say(f"unpacking {source}")
        _unpack(store, layer_id, source, workdir)
        say(f"{source} is layer {layer_id}")
    env = dict(item.partition("=")[::2] for item in settings.get("Env") or [])
    # An image without a user runs as root; by uid, since scratch-like images have no /etc/passwd.
    return Image(layers=[layer_id], env=env, workdir=workdir, user=settings.get("User") or "0", host_binds=False)


def _check_source(kind: str, ref: str) -> None:
    """Says what is wrong with a missing path before skopeo says it less clearly."""
    path = Path(ref.split(":", 1)[0])
    if not ref or not path.name:
        raise InvalidResource(f"base {kind}:{ref} names no path: use {BASE_FORMS}")
    if kind == "oci" and not (path / "index.json").is_file():
        raise InvalidResource(f"base {kind}:{ref}: {path} is not an OCI image layout (it has no index.json): "
                              f"give a directory made by {MAKERS[kind]}")
    if kind != "oci" and not path.is_file():
        raise InvalidResource(f"base {kind}:{ref}: {path} does not exist or is not a file: "
                              f"give a tar made by {MAKERS[kind]}")


def _inspect_config(store: LayerStore, kind: str, ref: str) -> str:
    """The image's config (JSON), for the platform of this machine when the image has several."""
    scratch = store.staging("inspect")  # skopeo extracts an oci-archive here: in the store, never left behind
    try:
        done = _tool(["skopeo", "--tmpdir", str(scratch), "inspect", "--raw", "--config", f"{kind}:{ref}"])
    finally:
        remove_tree(scratch)
    if done.returncode != 0:
        hint = _tags_hint(ref) if kind == "oci" else f"check that it is a tar made by {MAKERS[kind]}"
        raise InvalidResource(f"cannot read the image {kind}:{ref}: {_tool_message(done.stderr)}; {hint}")
    return done.stdout


def _tags_hint(ref: str) -> str:
    """Names the tags an OCI layout has, for the message about one it lacks."""
    path = Path(ref.split(":", 1)[0])
    try:
        index = json.loads((path / "index.json").read_text())
    except (OSError, ValueError):
        return f"check that {path} is an OCI image layout"
    tags = sorted(m.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
                  for m in index.get("manifests", []))
    named = [tag for tag in tags if tag]
    return f"the tags in {path} are: {', '.join(named)}" if named else f"{path} has no tagged images"


def _unpack(store: LayerStore, layer_id: str, source: str, workdir: str | None) -> None:
    """Copies the image into a private layout (skopeo) and unpacks its root filesystem (umoci)."""
    staged = store.staging(layer_id)
    try:
        layout, bundle = staged / "layout", staged / "bundle"
        # skopeo extracts an oci-archive under --tmpdir (not /var/tmp), so crashes leave nothing behind
        for argv in (["skopeo", "--tmpdir", str(staged), "copy", "--quiet", source, f"oci:{layout}:{UNPACK_TAG}"],
                     ["umoci", "unpack", "--image", f"{layout}:{UNPACK_TAG}", str(bundle)]):
            done = _tool(argv)
            if done.returncode != 0:
                raise BuildFailed(f"unpacking {source} failed ({argv[0]}): {_tool_message(done.stderr)}; make or "
                                  f"copy the image again, and check the free space under {store.layers}",
                                  exit_code=done.returncode, output=done.stderr)
        rootfs = bundle / "rootfs"
        for path in ("/proc", "/sys", "/dev", workdir):  # so runtimes do not make them in each sandbox's upper
            if path:
                _make_dir(rootfs, path)
        store.commit(layer_id, rootfs)
    finally:
        remove_tree(staged)


def _make_dir(rootfs: Path, path: str) -> None:
    """Creates a directory the image lacks (as container runtimes do) without following the image's links.

    A link in the image may point anywhere on this machine; the sandbox resolves it inside itself.
    """
    current = rootfs
    for part in Path(os.path.normpath("/" + path)).parts[1:]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            return
        current.mkdir(exist_ok=True)


def _tool(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT)
    except FileNotFoundError:
        raise BuildFailed(f"{argv[0]} is not installed: run scripts/setup.sh (or apt-get install {argv[0]})") \
            from None
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"{' '.join(argv)} took longer than {TOOL_TIMEOUT:.0f} s") from None


def _tool_message(stderr: str) -> str:
    """The message of a Go tool's log line (`level=fatal msg="..."`), or its last line."""
    match = _SKOPEO_MESSAGE.search(stderr)
    if match:
        return match.group(1).replace('\\"', '"')
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else "no output"


def _digest(parts: list[str]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()
