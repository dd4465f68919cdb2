"""Builds a `SandboxTemplate` into an image: a stack of content-addressed, cached layers.

Each step's layer is named by the hash of its parent's name and the step (and, for `copy`, the
copied content), so rebuilding an unchanged template finds every layer and does no work. `run`
steps execute in a build container (root, the host's network) over the layers so far; what they
write becomes the step's layer. `env`, `workdir` and `user` change the image's settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from functools import partial
from pathlib import Path

from rollbox.engine import accounts, bases, mounts
from rollbox.engine.cgroups import Cgroups
from rollbox.engine.hostbase import host_base_layer, host_binds
from rollbox.engine.images import reference
from rollbox.engine.images.registry import Credentials
from rollbox.engine.images.store import ImageStore, PulledImage
from rollbox.engine.layers import LayerStore, remove_tree
from rollbox.engine.oci import Bind, ContainerConfig, container_spec
from rollbox.engine.runtimes import Runtime
from rollbox.engine.store import Image
from rollbox.errors import BuildFailed, InvalidRequest, InvalidResource
from rollbox.spec import Limits, SandboxTemplate, Step

Progress = Callable[[str], None]
BUILD_LIMITS = Limits(cpu=2, memory=8 * 2**30, pids=8192)
STEP_TIMEOUT = 1800.0


class Builder:
    def __init__(self, layers: LayerStore, runtime: Runtime, work_dir: Path, cgroups: Cgroups, images: ImageStore
                 ) -> None:
        self.layers = layers
        self.images = images
        self.runtime = runtime
        self.work_dir = work_dir
        self.cgroups = cgroups
        work_dir.mkdir(parents=True, exist_ok=True)

    def build(self, template: SandboxTemplate, progress: Progress | None = None,
              credentials: Credentials | None = None) -> Image:
        say = progress or (lambda _: None)
        spec = template.spec
        say(f"base {spec.base}")
        image = self._base(spec.base, say, credentials or {})
        key = hashlib.sha256(json.dumps(image.layers).encode()).hexdigest()
        final_user = spec.user
        for number, step in enumerate(spec.steps, 1):
            say(f"step {number}/{len(spec.steps)}: {step.kind}")
            key = _chain(key, step.model_dump(by_alias=True, exclude_none=True))
            if step.env is not None:
                image.env.update(step.env)
            elif step.user is not None:
                image.user = step.user
            elif step.workdir is not None:
                image.workdir = step.workdir
                self._layer(image, "wd-" + key[:24], partial(self._make_dirs, image, path=step.workdir,
                                                             owner=final_user))
            elif step.copy_ is not None:
                key = _chain(key, _digest_source(self._copy_source(template, step)))
                self._layer(image, "cp-" + key[:24], partial(self._copy, template, image, step=step,
                                                             default_owner=final_user))
            elif step.run is not None:
                layer_id = "run-" + key[:24]
                if not self.layers.exists(layer_id):
                    self._run(image, layer_id, step.run, say)
                image.layers.insert(0, layer_id)
        image.env.update(spec.env)
        image.workdir = spec.workdir or image.workdir
        image.user = final_user
        self._ensure_account(image, final_user, key)
        return image

    def _base(self, base: str, say: Progress, credentials: Credentials) -> Image:
        if base == "host":
            return Image(layers=[host_base_layer(self.layers)], env={}, user="root", host_binds=True)
        if reference.is_image(base):
            return _from_image(self.images.pull(base, credentials, say))
        kind, _, ref = base.partition(":")
        if kind == "debian":
            return bases.debian_base(self.layers, ref, say)
        if kind in bases.OCI_KINDS:
            return _from_image(self.images.local(kind, ref, say))
        raise InvalidResource(f"unknown base {base!r}: use {bases.BASE_FORMS}")

    def _layer(self, image: Image, layer_id: str, fill: Callable[[Path], None]) -> None:
        if not self.layers.exists(layer_id):
            staged = self.layers.staging(layer_id)
            try:
                fill(staged)
            except BaseException:
                remove_tree(staged)
                raise
            self.layers.commit(layer_id, staged)
        image.layers.insert(0, layer_id)

    def _make_dirs(self, image: Image, root: Path, path: str, owner: str) -> None:
        """Creates `path` in a new layer; existing parents keep the owner and mode they have below."""
        below = self.layers.stack_paths(image.layers)
        account = accounts.resolve(below, owner)
        current = root
        parts = Path(path.lstrip("/")).parts
        for index, part in enumerate(parts):
            current = current / part
            relative = Path(*parts[: index + 1])
            existing = next((layer / relative for layer in below if (layer / relative).is_dir()), None)
            current.mkdir(exist_ok=True)
            if existing is not None:
                info = existing.stat()
                os.chown(current, info.st_uid, info.st_gid)
                os.chmod(current, stat.S_IMODE(info.st_mode))
            else:
                os.chown(current, account.uid, account.gid)

    def _copy_source(self, template: SandboxTemplate, step: Step) -> Path:
        assert step.copy_ is not None
        context = Path(template.context_dir or ".").resolve()
        source = (context / step.copy_.src).resolve()
        if not source.is_relative_to(context):
            raise InvalidResource(f"copy.src {step.copy_.src!r} leaves the template's directory {context}")
        if not source.exists():
            raise InvalidResource(f"copy.src {step.copy_.src!r}: {source} does not exist")
        return source

    def _copy(self, template: SandboxTemplate, image: Image, root: Path, step: Step, default_owner: str) -> None:
        assert step.copy_ is not None
        source = self._copy_source(template, step)
        account = accounts.resolve(self.layers.stack_paths(image.layers), step.copy_.owner or default_owner)
        dest = step.copy_.dest
        if source.is_file() and not dest.endswith("/"):
            self._make_dirs(image, root, str(Path(dest).parent), step.copy_.owner or default_owner)
            target = root / dest.lstrip("/")
            shutil.copy2(source, target)
            os.chown(target, account.uid, account.gid)
            return
        target_dir = dest if source.is_dir() else str(Path(dest) / source.name)
        self._make_dirs(image, root, target_dir if source.is_dir() else dest, step.copy_.owner or default_owner)
        if source.is_dir():
            shutil.copytree(source, root / target_dir.lstrip("/"), symlinks=True, dirs_exist_ok=True)
            for path in (root / target_dir.lstrip("/")).rglob("*"):
                os.chown(path, account.uid, account.gid, follow_symlinks=False)
        else:
            shutil.copy2(source, root / target_dir.lstrip("/"))
            os.chown(root / target_dir.lstrip("/"), account.uid, account.gid)

    def _run(self, image: Image, layer_id: str, command: str, say: Progress) -> None:
        name = f"build-{secrets.token_hex(6)}"
        bundle = self.work_dir / name
        rootfs, work = bundle / "rootfs", bundle / "work"
        rootfs.mkdir(parents=True)
        work.mkdir()
        upper = self.layers.staging(layer_id)
        log = bundle / "output.log"
        lowers = self.layers.stack_paths(image.layers)
        account = accounts.resolve(lowers, image.user)
        try:
            mounts.mount_overlay(rootfs, lowers, upper, work)
            binds = host_binds() if image.host_binds else []
            if Path("/etc/resolv.conf").exists():
                binds.append(Bind("/etc/resolv.conf", "/etc/resolv.conf"))
            env = {"HOME": account.home, "DEBIAN_FRONTEND": "noninteractive", **image.env}
            spec = container_spec(ContainerConfig(
                args=["/bin/sh", "-c", command], cgroups_path=self.cgroups.path_for(name), limits=BUILD_LIMITS,
                binds=binds, env=[f"{k}={v}" for k, v in env.items()], build=True))
            spec["process"]["user"] = {"uid": account.uid, "gid": account.gid,
                                       "additionalGids": list(account.groups)}
            spec["process"]["cwd"] = image.workdir or "/"
            (bundle / "config.json").write_text(json.dumps(spec))
            code = self.runtime.run_to_end(name, bundle, log, STEP_TIMEOUT)
        finally:
            mounts.umount(rootfs)
            self.cgroups.remove(name)
        output = log.read_text(errors="replace") if log.exists() else ""
        remove_tree(bundle)
        if code != 0:
            remove_tree(upper)
            shown = output[-4000:]
            say(shown)
            raise BuildFailed(f"step `run: {command}` failed with exit code {code}:\n{shown}",
                              exit_code=code, output=output)
        self.layers.commit(layer_id, upper)

    def _ensure_account(self, image: Image, user: str, key: str) -> None:
        """Adds the default unprivileged account (uid 1000) to images that lack it."""
        lowers = self.layers.stack_paths(image.layers)
        try:
            accounts.resolve(lowers, user)
            return
        except InvalidRequest:
            if user != "user":
                raise
        layer_id = "acct-" + _chain(key, "user")[:24]

        def fill(root: Path) -> None:
            (root / "etc").mkdir()
            for name, line in (("passwd", "user:x:1000:1000:user:/home/user:/bin/sh\n"),
                               ("group", "user:x:1000:\n")):
                text = accounts.read_in_layers(lowers, f"etc/{name}") or ""
                (root / "etc" / name).write_text(text + ("" if text.endswith("\n") or not text else "\n") + line)
            self._make_dirs(image, root, "/home/user", "1000:1000")

        self._layer(image, layer_id, fill)


def image_settings(settings: dict[str, object]) -> dict[str, object]:
    """What an image's config says of how its processes run; an image that names no user runs as root (by uid:
    scratch-like images have no /etc/passwd)."""
    env = dict(str(item).partition("=")[::2] for item in settings.get("Env") or [])  # type: ignore[attr-defined]
    return {"env": env, "workdir": settings.get("WorkingDir") or None, "user": settings.get("User") or "0",
            "host_binds": False}


def _from_image(pulled: PulledImage) -> Image:
    return Image(layers=list(pulled.layers), **image_settings(pulled.settings))  # type: ignore[arg-type]


def _chain(key: str, value: object) -> str:
    return hashlib.sha256((key + json.dumps(value, sort_keys=True)).encode()).hexdigest()


def _digest_source(source: Path) -> str:
    digest = hashlib.sha256()
    paths = [source] if source.is_file() else sorted(source.rglob("*"))
    for path in paths:
        info = path.lstat()
        digest.update(f"{path.relative_to(source) if path != source else ''}\0{info.st_mode}\0".encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()
