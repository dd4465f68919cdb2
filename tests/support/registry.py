"""A real OCI registry on loopback (Debian's `docker-registry`, the CNCF distribution registry) and images made
here, byte by byte, to push to it: nothing is pulled from outside.

`ImageMaker` writes OCI layouts with Python's tarfile and gzip, so that a test says exactly which files,
whiteouts and opaque directories each layer has; skopeo pushes them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "echo", "id", "pwd", "env", "test", "stat", "mkdir", "rm", "sleep", "true", "wc",
           "head", "du", "find", "grep", "sha256sum", "touch")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"

Files = Mapping[str, "bytes | str | Path | None"]
"""Path in the image -> content (bytes or text), a host file to copy, or None for a directory. A name
`.wh.X` is a whiteout and `DIR/.wh..wh..opq` an opaque marker, as in any OCI layer."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Layer:
    blob: bytes
    diff_id: str

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.blob).hexdigest()


def make_layer(files: Files, *, symlinks: Mapping[str, str] | None = None, uid: int = 0, level: int = 1) -> Layer:
    """One layer as a gzipped tar, and its uncompressed digest."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, content in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.uid = info.gid = uid
            info.mtime = 1_700_000_000
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            data = content.read_bytes() if isinstance(content, Path) else \
                content.encode() if isinstance(content, str) else content
            info.size, info.mode = len(data), 0o755 if isinstance(content, Path) else 0o644
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted((symlinks or {}).items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 1_700_000_000
            tar.addfile(info)
    raw = plain.getvalue()
    return Layer(gzip.compress(raw, compresslevel=level, mtime=0), "sha256:" + hashlib.sha256(raw).hexdigest())


def raw_layer(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Layer:
    """A layer of exactly these tar members, in this order (for attacks: `..`, links out, devices, xattrs)."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = plain.getvalue()
    return Layer(gzip.compress(raw, compresslevel=1, mtime=0), "sha256:" + hashlib.sha256(raw).hexdigest())


def busybox_layer() -> Layer:
    """A tiny base: Debian's static busybox with the applets tests use, and the sandbox's account files."""
    files: dict[str, bytes | str | Path | None] = {"bin/busybox": BUSYBOX, "etc/passwd": "root:x:0:0::/root:/bin/sh\n",
                                                   "etc/group": "root:x:0:\n", "root": None, "tmp": None}
    return make_layer(files, symlinks={f"bin/{applet}": "busybox" for applet in APPLETS})


@dataclass
class ImageMaker:
    """Writes images into one OCI layout (blobs shared between them) under `root`."""

    root: Path
    layout: Path = field(init=False)

    def __post_init__(self) -> None:
        self.layout = self.root / "layout"
        (self.layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        if not (self.layout / "index.json").exists():
            (self.layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": []}))

    def _put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (self.layout / "blobs" / "sha256" / digest).write_bytes(data)
        return f"sha256:{digest}"

    def image(self, tag: str, layers: list[Layer], *, env: Mapping[str, str] | None = None,
              workdir: str | None = None, user: str | None = None, cmd: list[str] | None = None) -> str:
        """Writes an image (layers bottom first) tagged `tag` in the layout; returns its manifest digest."""
        settings: dict[str, object] = {"Env": [f"{k}={v}" for k, v in (env or {"PATH": "/bin"}).items()]}
        if workdir:
            settings["WorkingDir"] = workdir
        if user:
            settings["User"] = user
        if cmd:
            settings["Cmd"] = cmd
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": settings,
                             "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]}}).encode()
        for layer in layers:
            self._put(layer.blob)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": self._put(config), "size": len(config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": layer.digest, "size": len(layer.blob)} for layer in layers],
        }).encode()
        digest = self._put(manifest)
        index = json.loads((self.layout / "index.json").read_text())
        index["manifests"] = [m for m in index["manifests"]
                              if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
        index["manifests"].append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest),
                                   "annotations": {"org.opencontainers.image.ref.name": tag}})
        (self.layout / "index.json").write_text(json.dumps(index))
        return digest


@dataclass
class Registry:
    """A registry on 127.0.0.1:`port`, its storage under `root`; with `users`, it wants basic auth."""

    root: Path
    users: Mapping[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    auth: list[str] | None = None
    """The config's `auth:` section, when not basic auth over `users` (a token server's, say)."""

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def storage(self) -> Path:
        return self.root / "storage"

    def start(self) -> Registry:
        self.root.mkdir(parents=True, exist_ok=True)
        lines = ["version: 0.1", "log:", "  level: error", "  accesslog:", "    disabled: true", "storage:",
                 "  filesystem:", f"    rootdirectory: {self.storage}", "  delete:", "    enabled: true",
                 "http:", f"  addr: {self.host}"]
        if self.auth is not None:
            lines += self.auth
        elif self.users:
            htpasswd = self.root / "htpasswd"
            htpasswd.write_text("".join(_bcrypt_line(user, password) for user, password in self.users.items()))
            lines += ["auth:", "  htpasswd:", "    realm: rollbox-tests", f"    path: {htpasswd}"]
        (self.root / "config.yml").write_text("\n".join(lines) + "\n")
        log = open(self.root / "registry.log", "ab")  # noqa: SIM115 - the registry writes it while it runs
        self.process = subprocess.Popen(["docker-registry", "serve", str(self.root / "config.yml")],
                                        stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{self.host}/v2/", timeout=1).status_code in (200, 401):
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"the registry did not start: {(self.root / 'registry.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def push(self, maker: ImageMaker, tag: str, repository: str, *, as_tag: str | None = None) -> str:
        """Pushes the layout's image (or index, with every image it names) `tag` as `repository:as_tag`; returns
        `HOST/REPO:TAG`."""
        reference = f"{self.host}/{repository}:{as_tag or tag}"
        creds = []
        if self.users:
            user, password = next(iter(self.users.items()))
            creds = ["--dest-creds", f"{user}:{password}"]
        subprocess.run(["skopeo", "copy", "--all", "--quiet", "--dest-tls-verify=false", *creds,
                        f"oci:{maker.layout}:{tag}", f"docker://{reference}"], check=True, capture_output=True,
                       env=_skopeo_env(self.root))
        return reference

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob on disk (for tests that tamper with it)."""
        hexdigest = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


@contextmanager
def running_registry(root: Path, users: Mapping[str, str] | None = None) -> Iterator[Registry]:
    registry = Registry(root, dict(users or {})).start()
    try:
        yield registry
    finally:
        registry.stop()


def module_registry(factory: pytest.TempPathFactory, users: Mapping[str, str] | None = None) -> Iterator[Registry]:
    """A tier's registry fixture body: skips where the tools are missing, yields a running registry."""
    if not BUSYBOX.is_file() or shutil.which("docker-registry") is None:
        pytest.skip("needs busybox-static and docker-registry (scripts/setup.sh installs them)")
    with running_registry(factory.mktemp("registry"), users) as registry:
        yield registry


def _bcrypt_line(user: str, password: str) -> str:
    done = subprocess.run(["htpasswd", "-Bbn", user, password], check=True, capture_output=True, text=True)
    return done.stdout.strip() + "\n"


def _skopeo_env(root: Path) -> dict[str, str]:
    """skopeo with no credentials but those given on its command line, and no signature policy of the machine's."""
    home = root / "skopeo-home"
    (home / ".config" / "containers").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "containers" / "policy.json").write_text(
        '{"default": [{"type": "insecureAcceptAnything"}]}')
    return {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(home), "XDG_CONFIG_HOME": str(home / ".config")}


class CuttingProxy:
    """A TCP proxy in front of a registry that breaks off the first `cuts` blob downloads after `after` bytes of
    answer (a connection cut mid-blob, as a flaky network makes it), and waits `pause` seconds before each piece
    it passes on (a slow one)."""

    def __init__(self, target: str, cuts: int = 1, after: int = 4096, pause: float = 0.0) -> None:
        self.target_host, _, port = target.rpartition(":")
        self.target_port = int(port)
        self.cuts, self.after, self.pause = cuts, after, pause
        self.port = free_port()
        self.blob_requests = 0
        self.digests: list[str] = []
        """Each blob request's digest, in order."""
        self._server: socket.socket | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> CuttingProxy:
        import threading

        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def _serve(self) -> None:
        import threading

        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        import threading

        upstream = socket.create_connection((self.target_host, self.target_port))
        cut = threading.Event()

        def forward_requests() -> None:
            while data := _recv(client):
                if b"/blobs/sha256:" in data and b"GET " in data:
                    self.blob_requests += 1
                    self.digests.append(data.split(b"/blobs/", 1)[1].split(b" ", 1)[0].decode())
                    if self.blob_requests <= self.cuts:
                        cut.set()
                upstream.sendall(data)
            upstream.close()

        threading.Thread(target=forward_requests, daemon=True).start()
        sent = 0
        while data := _recv(upstream):
            if cut.is_set() and sent + len(data) > self.after:
                client.sendall(data[: max(self.after - sent, 0)])
                break
            client.sendall(data)
            sent += len(data)
            if self.pause:
                time.sleep(self.pause)
        client.close()
        upstream.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def index_of(maker: ImageMaker, tag: str, platforms: Mapping[str, str]) -> None:
    """Tags in the layout an index of the images tagged as `platforms` says (architecture -> their tag)."""
    index = json.loads((maker.layout / "index.json").read_text())
    by_tag = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in index["manifests"]}
    entries = [{"mediaType": OCI_MANIFEST, "digest": by_tag[source]["digest"], "size": by_tag[source]["size"],
                "platform": {"os": "linux", "architecture": arch}} for arch, source in platforms.items()]
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    index["manifests"].append({"mediaType": OCI_INDEX, "digest": maker._put(body), "size": len(body),
                               "annotations": {"org.opencontainers.image.ref.name": tag}})
    (maker.layout / "index.json").write_text(json.dumps(index))
