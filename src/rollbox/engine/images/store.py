"""One store for every image a node runs: layers unpacked once each, shared by every image that has them.

A layer is named by its uncompressed digest (`layer-<hex>`), so two images that share a base share its
directory on disk and its pages in the page cache. Pulls of one image at the same moment are one pull;
a layer two pulls need is unpacked by one of them while the other waits. What a tenant may start is
decided by the registry, not by the cache: an image is handed out only to credentials that the registry
has recently let read it (`GRANT_SECONDS`), whoever pulled it first.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollbox.engine.images import flatten
from rollbox.engine.images.catalog import Catalog, ImageRecord
from rollbox.engine.images.progress import LayerProgress
from rollbox.engine.images.reference import ImageRef, parse
from rollbox.engine.images.registry import Credentials, Registry, RegistrySettings, credential_key
from rollbox.engine.images.sources import ArchiveSource, LayoutSource, RegistrySource, Resolved, Source
from rollbox.engine.images.unpack import unpack_layer
from rollbox.engine.layers import LayerStore, remove_tree
from rollbox.engine.store import Image
from rollbox.errors import ImageNotFound, InvalidRequest, InvalidResource

LAYER_PREFIX = "layer-"
TAG_SECONDS = 60.0
"""How long a tag's digest is trusted before the registry is asked again (tags move)."""
GRANT_SECONDS = 600.0
"""How long a registry's yes to some credentials reading an image stands: revoked access takes this long to bite."""
FETCH_WORKERS = 4

Say = Callable[[str], None]
_RECORDED = {"Cmd": "cmd", "Entrypoint": "entrypoint", "Healthcheck": "healthcheck", "StopSignal": "stopSignal",
             "Labels": "labels"}


@dataclass(frozen=True)
class PulledImage:
    digest: str
    name: str
    layers: list[str]
    """Top first."""
    config: dict[str, Any]

    @property
    def settings(self) -> dict[str, Any]:
        return self.config.get("config") or {}

    @property
    def reference(self) -> str:
        """The name pinned to the digest: what starts this very image again."""
        return self.name if "@" in self.name else f"{self.name}@{self.digest}"

    def image(self) -> Image:
        """What a container of this image starts from: its layers, and how its config says its processes run (an
        image that names no user runs as root, by uid: scratch-like images have no /etc/passwd). What the config
        says but rollbox does not act on is recorded, under the names a Dockerfile's instructions record it by."""
        settings = self.settings
        env = dict(str(item).partition("=")[::2] for item in settings.get("Env") or [])
        config = {key: settings[field] for field, key in _RECORDED.items() if settings.get(field)}
        config.update({key: sorted(settings[field]) for field, key in (("ExposedPorts", "exposedPorts"),
                                                                       ("Volumes", "volumes")) if settings.get(field)})
        return Image(layers=list(self.layers), env=env, workdir=settings.get("WorkingDir") or None,
                     user=settings.get("User") or "0", host_binds=False, config=config)


class ImageStore:
    """`held` names the layers something other than an image still needs (templates, snapshots, containers):
    eviction never takes those."""

    def __init__(self, layers: LayerStore, work_dir: Path, scratch_dir: Path, settings: RegistrySettings,
                 held: Callable[[], set[str]], budget: int | None = None) -> None:
        self.layers = layers
        self.scratch_dir = scratch_dir
        self.settings = settings
        self.budget = budget
        self._held = held
        work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.catalog = Catalog(work_dir / "images.db")
        self.registry = Registry(work_dir / "registry", settings)
        self._lock = threading.Lock()
        self._flights: dict[str, list[Any]] = {}
        """Work under way, by name: its lock and how many callers hold or wait for it."""
        self._tags: dict[tuple[str, str], tuple[str, float]] = {}
        self._grants: dict[tuple[str, str, str], float] = {}

    # -- pulling -----------------------------------------------------------------------------

    def pull(self, text: str, credentials: Credentials | None = None, say: Say | None = None) -> PulledImage:
        """The registry image `text` names, pulled if any layer is missing, once these credentials may read it."""
        ref, credentials = parse(text), credentials or {}
        say = say or (lambda _: None)
        key = credential_key(ref.host, credentials)
        cached = self._cached(ref, key, credentials)
        if cached is not None:
            return cached
        with self._flight(f"resolve {ref} {key}"):
            cached = self._cached(ref, key, credentials)  # the caller ahead in the flight may have just pulled it
            if cached is not None:
                return cached
            source = RegistrySource(self.registry, ref, credentials, self.settings.max_image_bytes)
            resolved = source.resolve()
            now = time.monotonic()
            self._grants[(ref.name, key, resolved.digest)] = now
            if not ref.digest:
                self._tags[(str(ref), key)] = (resolved.digest, now)
            return self._materialize(source, resolved, str(ref), say)

    def _cached(self, ref: ImageRef, key: str, credentials: Credentials) -> PulledImage | None:
        """The image, when its tag's digest is fresh, its layers are here and these credentials may read it."""
        digest = ref.digest or self._fresh_tag(str(ref), key)
        if digest is None:
            return None
        known = self.catalog.get(digest)
        if known is None or not self._present(known) or not self._granted(ref.name, key, digest, ref, credentials):
            return None
        self.catalog.touch(digest, str(ref))
        return _pulled(known, str(ref))

    def local(self, kind: str, path: str, say: Say | None = None) -> PulledImage:
        """An image on this machine: `oci:<dir>[:tag]`, `oci-archive:<file>` or `docker-archive:<file>`."""
        say = say or (lambda _: None)
        shown = f"{kind}:{path}"
        location, _, tag = path.partition(":") if kind == "oci" else (path, "", "")
        if not location or not Path(location).name:
            raise InvalidResource(f"base {shown} names no path: use {_LOCAL_FORMS}")
        scratch = self._scratch()
        try:
            source: Source = LayoutSource(Path(location), tag or None, shown, self.settings.max_image_bytes) \
                if kind == "oci" else ArchiveSource(self.registry, kind, Path(location), scratch,
                                                     self.settings.max_image_bytes)
            with self._flight(f"local {shown}"):
                return self._materialize(source, source.resolve(), shown, say)
        finally:
            remove_tree(scratch)

    def _materialize(self, source: Source, resolved: Resolved, name: str, say: Say) -> PulledImage:
        with self._flight(f"image {resolved.digest}"):
            known = self.catalog.get(resolved.digest)
            if known is not None and self._present(known):
                self.catalog.touch(resolved.digest, name)
                return _pulled(known, name)
            ids = [LAYER_PREFIX + diff_id.split(":", 1)[1][:32] for diff_id in resolved.diff_ids]
            missing = [index for index, layer_id in enumerate(ids) if not self.layers.exists(layer_id)]
            fetched = sum(int(resolved.layers[index].get("size") or 0) for index in missing)
            say(f"pulling {name}: {len(ids)} layers, {len(missing)} to fetch ({fetched / 1e6:.1f} MB)")
            progress = LayerProgress(len(ids), say)
            scratch = self._scratch()
            try:
                with ThreadPoolExecutor(max_workers=FETCH_WORKERS) as pool:
                    for done in [pool.submit(self._layer, source, resolved, index, ids[index], scratch, progress)
                                 for index in missing]:
                        done.result()
            finally:
                remove_tree(scratch)
            stack = flatten.within_limits(self.layers, list(reversed(ids)))
            sizes = {layer: _disk_bytes(self.layers.path(layer)) for layer in stack}
            now = time.time()
            record = ImageRecord(resolved.digest, [name], resolved.config, stack, now, now)
            known_names = known.names if known else []
            record.names = sorted({*known_names, name})
            self.catalog.put(record, sizes)
            say(f"{name} is {resolved.digest} ({sum(sizes.values()) / 1e6:.1f} MB unpacked)")
        self.evict(keep=set(stack))
        return _pulled(record, name)

    def _layer(self, source: Source, resolved: Resolved, index: int, layer_id: str, scratch: Path,
               progress: LayerProgress) -> None:
        layer, diff_id = resolved.layers[index], resolved.diff_ids[index]
        with self._flight(f"layer {layer_id}"):
            if self.layers.exists(layer_id):
                return
            into = scratch / f"layer-{index}"
            into.mkdir()
            blob, copied = source.fetch(layer, into, progress.watcher(index, layer))
            staged = self.layers.staging(layer_id)
            try:
                unpack_layer(blob, layer["digest"], diff_id, staged, self.settings.max_image_bytes)
            except BaseException:
                remove_tree(staged)
                raise
            finally:
                if copied:
                    remove_tree(into)
            self.layers.commit(layer_id, staged)
            progress.unpacked(index)

    # -- access ------------------------------------------------------------------------------

    def _fresh_tag(self, reference: str, key: str) -> str | None:
        found = self._tags.get((reference, key))
        return found[0] if found and time.monotonic() - found[1] < TAG_SECONDS else None

    def _granted(self, name: str, key: str, digest: str, ref: ImageRef, credentials: Credentials) -> bool:
        """Whether these credentials may read `name@digest`: recently proven, or proven now by asking."""
        granted = self._grants.get((name, key, digest))
        if granted is not None and time.monotonic() - granted < GRANT_SECONDS:
            return True
        if not self.registry.readable(ref.pinned(digest), credentials):
            raise ImageNotFound(f"image {ref} was not found, or the credentials given cannot read it: register "
                                f"credentials for {ref.host} that can")
        self._grants[(name, key, digest)] = time.monotonic()
        return True

    # -- what is here ------------------------------------------------------------------------

    def get(self, text: str) -> ImageRecord:
        """A local image by digest, canonical reference or local path (no registry is asked)."""
        record = self.catalog.get(text) if text.startswith("sha256:") else self.catalog.by_name(text)
        if record is None:
            with contextlib.suppress(InvalidRequest):
                ref = parse(text)
                record = self.catalog.get(ref.digest) if ref.digest else self.catalog.by_name(str(ref))
        if record is None:
            raise ImageNotFound(f"image {text!r} is not on this node: pull it first")
        return record

    def images(self) -> list[ImageRecord]:
        return self.catalog.all()

    def remove(self, digest: str) -> None:
        """Forgets an image; its layers go once nothing else holds them."""
        self.catalog.forget(digest)
        self.evict(keep=set(), budget=0, only_unnamed=True)

    def evict(self, keep: set[str], budget: int | None = None, only_unnamed: bool = False) -> int:
        """Removes image layers no image, template, snapshot or container holds, least recently used first, until
        the layers fit `budget` (the store's own by default); with `only_unnamed`, only layers no image names.
        Returns the bytes freed."""
        budget = self.budget if budget is None else budget
        with self._lock:
            layers = self.catalog.layers()
            total = sum(size for size, _ in layers.values())
            if budget is None or total <= budget:
                return 0
            images = self.catalog.all()
            named = {layer for record in images for layer in record.layers}
            held = self._held() | keep | {name.split(" ", 1)[1] for name in self._flights if name.startswith("layer ")}
            freed = 0
            for layer, (size, _) in sorted(layers.items(), key=lambda item: item[1][1]):
                if total - freed <= budget:
                    break
                if layer in held or (only_unnamed and layer in named):
                    continue
                for record in images:
                    if layer in record.layers:
                        self.catalog.forget(record.digest)
                self.layers.remove(layer)
                self.catalog.forget_layer(layer)
                freed += size
            return freed

    def close(self) -> None:
        self.catalog.close()

    # -- plumbing ----------------------------------------------------------------------------

    def _present(self, record: ImageRecord) -> bool:
        return all(self.layers.exists(layer) for layer in record.layers)

    def _scratch(self) -> Path:
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        path = self.scratch_dir / f"pull-{time.monotonic_ns()}-{threading.get_ident()}"
        path.mkdir()
        return path

    @contextlib.contextmanager
    def _flight(self, name: str) -> Iterator[None]:
        """One caller at a time per `name`; the others wait and then find its work done."""
        with self._lock:
            flight = self._flights.setdefault(name, [threading.Lock(), 0])
            flight[1] += 1
        try:
            with flight[0]:
                yield
        finally:
            with self._lock:
                flight[1] -= 1
                if not flight[1]:
                    del self._flights[name]


_LOCAL_FORMS = "oci:<dir>[:tag], oci-archive:<file.tar> or docker-archive:<file.tar>"


def _pulled(record: ImageRecord, name: str) -> PulledImage:
    return PulledImage(record.digest, name, list(record.layers), record.config)


def _disk_bytes(path: Path) -> int:
    """What a layer takes on disk (allocated blocks; hard links inside it counted once)."""
    seen: set[int] = set()
    total = 0
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                info = (Path(root) / name).lstat()
                if info.st_ino not in seen:
                    seen.add(info.st_ino)
                    total += info.st_blocks * 512
    return total
