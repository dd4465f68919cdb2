"""The `host` base: the host's `/usr`, bound read-only, under a private minimal `/etc`.

Nothing else of the host is visible: not its `/etc` (beyond a few files every host user may read,
so never its private keys), `/home`, `/root`, `/var` or sockets. Each subdirectory of `/usr` except
`/usr/local` is bound separately, so builds can still install into `/usr/local`. The binds are
nosuid, so setuid programs under `/usr` grant nothing.

`python` runs the host's `python3` (a link in `/usr/local/bin`, ahead of `/usr/bin` on the PATH), since
many agent scripts and demos call `python`, which Debian's `/usr` does not have.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from rollbox.engine.layers import LayerStore
from rollbox.engine.oci import Bind

VERSION = "host-base-4"
_COPIED_FROM_HOST_ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "debian_version",
                         "os-release", "bash.bashrc", "profile", "inputrc", "mime.types", "protocols",
                         "services", "ssl", "ca-certificates")
_USR = Path("/usr")
PASSWD = ("root:x:0:0:root:/root:/bin/bash\n"
          "user:x:1000:1000:user:/home/user:/bin/bash\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUP = "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n"
HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
PYTHON3 = _USR / "bin" / "python3"


def _private(directory: str, names: list[str]) -> set[str]:
    """Entries of a host directory that not every host user may read (private keys and the like)."""
    return {name for name in names if not _public(Path(directory) / name)}


def _public(path: Path) -> bool:
    return path.is_symlink() or bool(path.stat().st_mode & 0o004)


def host_binds() -> list[Bind]:
    return [Bind(str(entry), str(entry)) for entry in sorted(_USR.iterdir())
            if entry.is_dir() and not entry.is_symlink() and entry.name != "local"]


def host_base_layer(store: LayerStore) -> str:
    """Builds (once) the layer that holds the host base's own files, and returns its id."""
    digest = hashlib.sha256(VERSION.encode())
    for name in _COPIED_FROM_HOST_ETC:
        digest.update(name.encode())
        path = Path("/etc") / name
        if path.is_file():
            digest.update(path.read_bytes())
    layer_id = "host-" + digest.hexdigest()[:16]
    if store.exists(layer_id):
        return layer_id
    root = store.staging(layer_id)
    for name in ("proc", "sys", "dev", "run", "mnt", "opt", "srv", "var/log", "var/lib", "var/cache",
                 "usr/local/bin", "usr/local/lib", "usr/local/share", "usr/local/include"):
        (root / name).mkdir(parents=True, exist_ok=True)
    for bind in host_binds():
        (root / bind.destination.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for name in ("tmp", "var/tmp"):
        (root / name).mkdir(parents=True, exist_ok=True)
        os.chmod(root / name, 0o1777)
    (root / "root").mkdir(mode=0o700)
    home = root / "home" / "user"
    home.mkdir(parents=True)
    os.chown(home, 1000, 1000)
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if (Path("/") / link).is_symlink():
            (root / link).symlink_to(os.readlink(Path("/") / link))
    if PYTHON3.exists():
        (root / "usr/local/bin/python").symlink_to(PYTHON3)
    etc = root / "etc"
    etc.mkdir()
    # Only what every host user may read: /etc/ssl brings certificates, never /etc/ssl/private.
    for name in _COPIED_FROM_HOST_ETC:
        source = Path("/etc") / name
        if source.is_dir() and _public(source):
            shutil.copytree(source, etc / name, symlinks=True, ignore=_private)
        elif source.is_file() and _public(source):
            shutil.copy2(source, etc / name)
    for entry in Path("/etc").glob("python3*"):
        shutil.copytree(entry, etc / entry.name, symlinks=True, ignore=_private)
    files = {"passwd": PASSWD, "group": GROUP, "hosts": HOSTS, "hostname": "sandbox\n", "resolv.conf": "",
             "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n", "shadow": ""}
    for name, text in files.items():
        (etc / name).write_text(text)
    os.chmod(etc / "shadow", 0o600)
    store.commit(layer_id, root)
    return layer_id
