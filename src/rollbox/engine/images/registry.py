"""Talks to registries through skopeo: resolve a reference to a manifest and config, fetch single layers.

skopeo speaks the distribution protocol (bearer-token and basic auth, mirrors from a registries.conf,
TLS) so rollbox never does. Every call runs with a private HOME and runtime directory, so no
credentials of the machine's own users are ever picked up: a pull uses exactly the auth file it is
given. Digests are not trusted from skopeo: the caller hashes every byte it reads.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.engine.images.reference import ImageRef
from rollbox.errors import BuildFailed, ImageNotFound, ImagePullFailed, ImageRefused, InvalidResource

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
MAX_DOCUMENT = 4 * 2**20
"""A manifest, an index or a config larger than this is refused: real ones are kilobytes."""
CALL_TIMEOUT = 120.0
STALL_SECONDS = 60.0
"""A layer download that receives nothing for this long is stopped and tried again."""
RETRIES = 4
BACKOFF = 0.5
_MESSAGE = re.compile(r'msg="((?:[^"\\]|\\.)*)"')
_DENIED = ("unauthorized", "denied", "authentication required", "manifest unknown", "name unknown", "blob unknown",
           "(not found)", "registry 401", "registry 403", "registry 404")
_PR_SET_PDEATHSIG = 1
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}

Credentials = Mapping[str, tuple[str, str]]
"""Registry host -> (username, password)."""


@dataclass(frozen=True)
class RegistrySettings:
    """How this node reaches registries. `auth_file` is a docker config.json every pull may use (the
    operator's); `mirrors` maps a registry host to the hosts tried before it; `insecure` names the hosts
    reached over plain HTTP or unverified TLS (never any other)."""

    auth_file: Path | None = None
    mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    insecure: frozenset[str] = frozenset()
    max_image_bytes: int = 64 * 2**30


Progress = Callable[[int], None]
"""Told the bytes received so far."""


class Registry:
    def __init__(self, work_dir: Path, settings: RegistrySettings) -> None:
        self.work_dir = work_dir
        self.settings = settings
        self._home = work_dir / "home"
        self._auth_dir = work_dir / "auth"
        for path in (work_dir, self._home, self._auth_dir):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        for left in self._auth_dir.iterdir():  # a process killed mid-pull leaves its credentials file
            left.unlink()
        self._conf = work_dir / "registries.conf"
        self._conf.write_text(registries_conf(settings))
        self._env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self._home),
                     "XDG_RUNTIME_DIR": str(self._home), "XDG_CONFIG_HOME": str(self._home / ".config"),
                     "LC_ALL": "C"}
        self._skopeo = ["skopeo", "--registries-conf", str(self._conf)]

    # -- resolving ---------------------------------------------------------------------------

    def resolve(self, ref: ImageRef, credentials: Credentials) -> tuple[ImageRef, dict[str, Any], dict[str, Any]]:
        """The reference pinned to the manifest for this machine's platform, that manifest and its config, each
        checked against its digest."""
        with self._auth(ref, credentials) as auth:
            raw = self._inspect(ref, auth)
            digest = "sha256:" + hashlib.sha256(raw).hexdigest()
            if ref.digest and digest != ref.digest:
                raise ImageRefused(f"image {ref}: the registry answered a manifest whose digest is {digest}, not "
                                   f"{ref.digest}: refused (tampered, or a broken registry)")
            document = _json(raw, f"the manifest of {ref}")
            if media_type(document) in INDEX_TYPES:
                digest = platform_manifest(str(ref), document, platform.machine())
                raw = self._inspect(ref.pinned(digest), auth)
                if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
                    raise ImageRefused(f"image {ref}: the manifest for this platform does not match its digest "
                                       f"{digest}: refused")
                document = _json(raw, f"the manifest of {ref}")
            pinned = ref.pinned(digest)
            if media_type(document) not in MANIFEST_TYPES or "config" not in document:
                raise ImageRefused(f"image {ref}: {media_type(document) or 'an unknown manifest type'} is not an "
                                   "image manifest rollbox can run (schema 2 or OCI)")
            config_raw = self._inspect(pinned, auth, config=True)
        want = document["config"].get("digest", "")
        if "sha256:" + hashlib.sha256(config_raw).hexdigest() != want:
            raise ImageRefused(f"image {ref}: its config does not match the digest {want} its manifest gives: refused")
        return pinned, document, _json(config_raw, f"the config of {ref}")

    def readable(self, ref: ImageRef, credentials: Credentials) -> bool:
        """Whether these credentials may read the image now (the registry is asked; nothing is fetched)."""
        try:
            with self._auth(ref, credentials) as auth:
                self._inspect(ref, auth)
        except ImageNotFound:
            return False
        return True

    def _inspect(self, ref: ImageRef, auth: Path, *, config: bool = False) -> bytes:
        argv = [*self._skopeo, "inspect", "--raw", *(["--config"] if config else []), "--authfile", str(auth),
                "--retry-times", "0", ref.transport]
        last = ""
        for attempt in range(RETRIES):
            done = self._call(argv)
            if done.returncode == 0:
                if len(done.stdout) > MAX_DOCUMENT:
                    raise ImageRefused(f"image {ref}: the registry answered more than {MAX_DOCUMENT} bytes for a "
                                       "manifest or config: refused")
                return done.stdout
            last = _message(done.stderr.decode(errors="replace"))
            if _denied(last):
                raise ImageNotFound(f"image {ref} was not found, or the credentials given cannot read it "
                                    f"({last}): check the name, or register credentials for {ref.host}")
            if attempt + 1 < RETRIES:
                time.sleep(BACKOFF * 2**attempt)
        raise ImagePullFailed(f"image {ref}: the registry did not answer after {RETRIES} tries: {last}")

    # -- layers ------------------------------------------------------------------------------

    def fetch_layer(self, ref: ImageRef, layer: dict[str, Any], into: Path, credentials: Credentials,
                    progress: Progress) -> Path:
        """Downloads one layer blob of the (pinned) image into the directory `into`, retrying with backoff.

        The blob is not checked here: the unpacker hashes it as it reads it."""
        size = int(layer.get("size") or 0)
        last = ""
        with self._auth(ref, credentials) as auth:
            for attempt in range(RETRIES):
                scratch = into / f"fetch-{attempt}"
                scratch.mkdir()
                code, last = self._download(ref, layer["digest"], scratch, auth, size, progress)
                if code == 0:
                    found = list(scratch.glob(f"layers-*/{layer['digest'].split(':', 1)[1]}"))
                    if found:
                        return found[0]
                    last = "skopeo wrote no blob"
                if _denied(last):
                    raise ImageNotFound(f"image {ref}: layer {layer['digest']} could not be read ({last})")
                if "larger than" in last:
                    raise ImageRefused(f"image {ref}: {last}: refused")
                shutil.rmtree(scratch, ignore_errors=True)
                if attempt + 1 < RETRIES:
                    time.sleep(BACKOFF * 2**attempt)
        raise ImagePullFailed(f"image {ref}: layer {layer['digest']} failed {RETRIES} times: {last}")

    def _download(self, ref: ImageRef, digest: str, scratch: Path, auth: Path, size: int,
                  progress: Progress) -> tuple[int, str]:
        """Runs `skopeo layers` for one blob, watching what it writes: stopped past the declared size, or when
        it stalls."""
        argv = [*self._skopeo, "layers", "--authfile", str(auth), "--retry-times", "0", ref.transport, digest]
        process = subprocess.Popen(argv, cwd=scratch, env=self._env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent)
        errors: list[bytes] = []
        reader = threading.Thread(target=lambda: errors.append(process.stderr.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        seen, moved = 0, time.monotonic()
        why = ""
        while process.poll() is None:
            time.sleep(0.1)
            now = _bytes_under(scratch)
            if now != seen:
                seen, moved = now, time.monotonic()
                progress(now)
            if size and now > size:
                why = f"layer {digest} is larger than the {size} bytes its manifest declares"
            elif time.monotonic() - moved > STALL_SECONDS:
                why = f"layer {digest} received nothing for {STALL_SECONDS:.0f} s"
            if why:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        reader.join()
        progress(_bytes_under(scratch))
        return (process.returncode if not why else -1), why or _message(b"".join(errors).decode(errors="replace"))

    def local(self, argv: list[str], scratch: Path, hint: str) -> bytes:
        """Runs skopeo on an image on this machine (an archive), its temporary files kept in `scratch`."""
        done = self._call([*self._skopeo, "--tmpdir", str(scratch), *argv])
        if done.returncode != 0:
            raise InvalidResource(f"cannot read the image {argv[-2] if argv[0] == 'copy' else argv[-1]}: "
                                  f"{_message(done.stderr.decode(errors='replace'))}; {hint}")
        return done.stdout

    # -- plumbing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _auth(self, ref: ImageRef, credentials: Credentials) -> Iterator[Path]:
        """A private auth file with the operator's entries and the caller's, removed after the call."""
        auths: dict[str, Any] = {}
        if self.settings.auth_file and self.settings.auth_file.is_file():
            auths.update(json.loads(self.settings.auth_file.read_text()).get("auths") or {})
        for host, (username, password) in credentials.items():
            auths[host] = {"auth": base64.b64encode(f"{username}:{password}".encode()).decode()}
        path = self._auth_dir / f"{secrets.token_hex(8)}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump({"auths": auths}, file)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def _call(self, argv: list[str]) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(argv, capture_output=True, env=self._env, timeout=CALL_TIMEOUT)
        except FileNotFoundError:
            raise BuildFailed("skopeo is not installed: run scripts/setup.sh (or apt-get install skopeo)") from None
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, -1, b"", f"no answer in {CALL_TIMEOUT:.0f} s".encode())


def _die_with_parent() -> None:
    """In the child, before exec: a download outlives no node killed mid-pull (its files would be removed under it)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def credential_key(host: str, credentials: Credentials) -> str:
    """Names the rights a set of credentials has on `host`: equal keys may share what one of them proved."""
    if host not in credentials:
        return "anonymous"
    return hashlib.sha256(json.dumps([host, *credentials[host]]).encode()).hexdigest()[:32]


def registries_conf(settings: RegistrySettings) -> str:
    """The containers-registries.conf (v2) skopeo reads: mirrors and the registries named insecure."""
    lines = ['unqualified-search-registries = ["docker.io"]', "short-name-mode = \"disabled\"", ""]
    hosts = sorted(set(settings.mirrors) | set(settings.insecure))
    for host in hosts:
        lines += ["[[registry]]", f'prefix = "{host}"', f'location = "{host}"',
                  f"insecure = {'true' if host in settings.insecure else 'false'}"]
        for mirror in settings.mirrors.get(host, ()):
            lines += ["[[registry.mirror]]", f'location = "{mirror}"',
                      f"insecure = {'true' if mirror in settings.insecure else 'false'}"]
        lines.append("")
    mirrored = {mirror for mirrors in settings.mirrors.values() for mirror in mirrors}
    for host in sorted(mirrored - set(hosts)):
        if host in settings.insecure:
            lines += ["[[registry]]", f'location = "{host}"', "insecure = true", ""]
    return "\n".join(lines)


def platform_manifest(shown: str, index: dict[str, Any], machine: str) -> str:
    """The digest of the index's manifest for this machine (linux, its architecture)."""
    arch = _GOARCH.get(machine, machine)
    offered = []
    for entry in index.get("manifests") or []:
        wanted = entry.get("platform") or {}
        offered.append(f"{wanted.get('os')}/{wanted.get('architecture')}")
        if wanted.get("os") == "linux" and wanted.get("architecture") == arch and entry.get("digest"):
            return str(entry["digest"])
    raise ImageNotFound(f"image {shown} has no manifest for linux/{arch} (it offers {', '.join(offered) or 'none'})")


def check_shape(shown: str, layers: list[dict[str, Any]], diff_ids: list[str], max_bytes: int) -> None:
    """Refuses, before anything is fetched, an image whose manifest and config disagree or that is too large."""
    if len(layers) != len(diff_ids):
        raise ImageRefused(f"image {shown}: its manifest lists {len(layers)} layers and its config "
                           f"{len(diff_ids)}: refused")
    total = sum(int(layer.get("size") or 0) for layer in layers)
    if total > max_bytes:
        raise ImageRefused(f"image {shown} is {total} bytes compressed, over this node's cap of {max_bytes}")
    for layer, diff_id in zip(layers, diff_ids, strict=True):
        for digest in (str(layer.get("digest", "")), str(diff_id)):
            if not (digest.startswith("sha256:") and len(digest) == 71 and digest[7:].isalnum()):
                raise ImageRefused(f"image {shown}: layer digest {digest!r} is not a sha256 digest: refused")


def media_type(document: dict[str, Any]) -> str:
    media = document.get("mediaType")
    if not media and document.get("manifests") is not None:
        return INDEX_TYPES[0]
    if not media and document.get("config") is not None:
        return MANIFEST_TYPES[0]
    return str(media or "")


def _json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise ImageRefused(f"{what} is not JSON: refused") from None
    if not isinstance(value, dict):
        raise ImageRefused(f"{what} is not a JSON object: refused")
    return value


def _message(stderr: str) -> str:
    match = _MESSAGE.search(stderr)
    if match:
        return match.group(1).replace('\\"', '"')
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("DEPRECATED")]
    return lines[-1] if lines else "no output"


def _denied(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in _DENIED)


def _bytes_under(path: Path) -> int:
    """The bytes of blob skopeo has written so far (beside it: a small manifest and version file)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            if name in ("manifest.json", "version"):
                continue
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
