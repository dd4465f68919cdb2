"""Builds a `SandboxTemplate` into an image: a stack of content-addressed, cached layers.

A template's plan (engine/plan.py) comes from its YAML `steps` or its Dockerfile (engine/dockerfile.py). Each
step's layer is named by the hash of its parent's name and the step (and, for a copy, the copied content), so
rebuilding an unchanged template finds every layer and does no work, and a changed step rebuilds from there on.
`run` steps execute in a build container (the host's network) over the layers so far; what they write becomes
the step's layer. Copies and directories are written through an overlay of the image (engine/copying.py).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rollbox.archives import build_context, dockerignore, read_dockerfile
from rollbox.engine import accounts, bases, dockerfile, mounts
from rollbox.engine.cgroups import Cgroups
from rollbox.engine.copying import Entry, Sources, Writer
from rollbox.engine.files import ContainerFiles
from rollbox.engine.hostbase import host_base_layer, host_binds
from rollbox.engine.images import reference
from rollbox.engine.images.registry import Credentials
from rollbox.engine.images.store import ImageStore
from rollbox.engine.layers import LayerStore, remove_tree
from rollbox.engine.oci import Bind, ContainerConfig, container_spec
from rollbox.engine.plan import Arg, Copy, Env, Op, Plan, Record, Run, Shell, Stage, User, Workdir, from_steps
from rollbox.engine.runtimes import Runtime
from rollbox.engine.store import Image
from rollbox.errors import BuildFailed, InvalidRequest, InvalidResource
from rollbox.spec import Limits, SandboxTemplate, TemplateSpec

Progress = Callable[[str], None]
Lookup = Callable[[str], Image | None]
"""A template's image by name, or None: what `FROM <template>` builds on."""


@dataclass(frozen=True)
class _Inputs:
    """What one build reads besides its template: the node's other templates, and registry credentials."""

    templates: Lookup
    credentials: Credentials
BUILD_LIMITS = Limits(cpu=2, memory=8 * 2**30, pids=8192)
STEP_TIMEOUT = 1800.0
DEFAULT_USER = "user"
DEFAULT_SHELL = ["/bin/sh", "-c"]
EMPTY_LAYER = "empty-1"
"""What `FROM scratch` starts from: an overlay needs a lower layer."""


@dataclass
class _State:
    """One stage as the builder goes through it."""

    image: Image
    key: str
    escape: str | None
    shell: list[str] = field(default_factory=lambda: list(DEFAULT_SHELL))
    args: dict[str, str] = field(default_factory=dict)
    """The ARGs in scope: declared in this stage (a global one only once redeclared here)."""
    global_args: dict[str, str] = field(default_factory=dict)
    user_given: bool = False
    """A USER (or the base image) chose the user: a Dockerfile template runs as it unless `spec.user` says."""

    def expand(self, word: str) -> str:
        """ARG and ENV values in a Dockerfile's word (ENV first, as Docker does)."""
        return str(dockerfile.expand(word, {**self.args, **self.image.env}, self.escape))


class Builder:
    def __init__(self, layers: LayerStore, runtime: Runtime, work_dir: Path, cgroups: Cgroups,
                 images: ImageStore) -> None:
        self.layers = layers
        self.images = images
        self.runtime = runtime
        self.work_dir = work_dir
        self.cgroups = cgroups
        work_dir.mkdir(parents=True, exist_ok=True)

    def build(self, template: SandboxTemplate, progress: Progress | None = None,
              templates: Lookup = lambda _: None, credentials: Credentials | None = None) -> Image:
        """`credentials` read the registry images the template names (FROM, COPY --from, its base)."""
        say = progress or (lambda _: None)
        inputs = _Inputs(templates, credentials or {})
        spec = template.spec
        plan = (dockerfile.parse(read_dockerfile(template), spec.target) if spec.dockerfile is not None
                else from_steps(spec))
        built: dict[int, _State] = {}
        for index in plan.needed():
            built[index] = self._stage(template, plan, index, built, say, inputs)
        state = built[plan.target]
        image = state.image
        explicit = "user" in spec.model_fields_set or plan.escape is None or not state.user_given
        image.env.update(spec.env)
        image.workdir = spec.workdir or image.workdir
        image.user = spec.user if explicit else image.user
        self._ensure_account(image, image.user, state.key)
        return image

    # -- stages -----------------------------------------------------------------------------

    def _stage(self, template: SandboxTemplate, plan: Plan, index: int, built: dict[int, _State], say: Progress,
               inputs: _Inputs) -> _State:
        stage = plan.stages[index]
        state = self._from(template, plan, stage, built, say, inputs)
        for number, op in enumerate(stage.ops, 1):
            say(f"{_stage_name(plan, index)}step {number}/{len(stage.ops)}: {op.where()}{type(op).__name__.lower()}")
            self._op(template, plan, state, op, built, say, inputs)
        return state

    def _from(self, template: SandboxTemplate, plan: Plan, stage: Stage, built: dict[int, _State], say: Progress,
              inputs: _Inputs) -> _State:
        if plan.escape is None:  # YAML steps
            say(f"base {stage.base}")
            image = self._base(stage.base, say, inputs.credentials)
            return _State(image, _layers_key(image), None, user_given=True)
        global_args: dict[str, str] = {}
        for arg in plan.global_args:
            value = _arg_value(arg, template.spec, global_args, plan.escape)
            global_args.update({arg.name: value} if value is not None else {})
        ref = str(dockerfile.expand(stage.base, global_args, plan.escape))
        say(f"line {stage.line}: FROM {ref}")
        found = plan.stage_index(ref, stage)
        if found is not None:
            source = built[found]
            image = replace(source.image, layers=list(source.image.layers), env=dict(source.image.env),
                            config=json.loads(json.dumps(source.image.config)))
            return _State(image, source.key, plan.escape, list(source.shell), {}, global_args, source.user_given)
        image = self._image(ref, say, inputs, stage.line)
        return _State(image, _layers_key(image), plan.escape, global_args=global_args,
                      user_given=image.user not in ("0", "root"))

    def _image(self, ref: str, say: Progress, inputs: _Inputs, line: int | None) -> Image:
        """What a FROM (or a COPY --from) names: scratch, a local image, a template of this node, or a registry's."""
        if ref.lower() == "scratch":
            self._ensure_layer(EMPTY_LAYER, lambda _: None)
            return Image(layers=[EMPTY_LAYER], user="0")
        if ref.split(":", 1)[0] in bases.OCI_KINDS or ref.startswith(reference.PREFIX):
            return self._base(ref, say, inputs.credentials)
        if not set("/:@") & set(ref):
            image = inputs.templates(ref)
            if image is not None:
                return replace(image, layers=list(image.layers), env=dict(image.env), config=dict(image.config))
        if not ref:
            raise InvalidResource(f"line {line}: FROM names no image (an ARG it uses has no value?)")
        return self._base(reference.as_base(ref), say, inputs.credentials)

    def _base(self, base: str, say: Progress, credentials: Credentials) -> Image:
        if base == "host":
            return Image(layers=[host_base_layer(self.layers)], env={}, user="root", host_binds=True)
        if reference.is_image(base):
            return self.images.pull(base, credentials, say).image()
        kind, _, ref = base.partition(":")
        if kind == "debian":
            return bases.debian_base(self.layers, ref, say)
        if kind in bases.OCI_KINDS:
            return self.images.local(kind, ref, say).image()
        raise InvalidResource(f"unknown base {base!r}: use {bases.BASE_FORMS}")

    # -- steps ------------------------------------------------------------------------------

    def _op(self, template: SandboxTemplate, plan: Plan, state: _State, op: Op, built: dict[int, _State],
            say: Progress, inputs: _Inputs) -> None:
        image = state.image
        if isinstance(op, Record):
            op.apply(image.config, state.expand if op.expand else None)
            return
        if isinstance(op, Copy):
            self._copy(template, plan, state, op, built, say, inputs)
            return
        material: Any = op.material
        if isinstance(op, Env):
            values = {state.expand(key): state.expand(value) for key, value in op.values}
            image.env.update(values)
            material = material or {"env": values}
        elif isinstance(op, Arg):
            value = _arg_value(op, template.spec, {**state.args, **image.env}, plan.escape, state.global_args)
            state.args.pop(op.name, None)
            state.args.update({op.name: value} if value is not None else {})
            material = {"arg": op.name, "value": value}
        elif isinstance(op, User):
            image.user, state.user_given = state.expand(op.user), True
            material = material or {"user": image.user}
            if image.user == DEFAULT_USER:
                self._ensure_account(image, image.user, state.key)
        elif isinstance(op, Shell):
            state.shell = list(op.argv)
            image.config["shell"] = state.shell
            material = {"shell": state.shell}
        elif isinstance(op, Workdir):
            path = state.expand(op.path)
            image.workdir = path if path.startswith("/") else f"{(image.workdir or '/').rstrip('/')}/{path}"
            owner = template.spec.user if plan.escape is None else image.user
            material = material or {"workdir": image.workdir, "owner": owner}
            key = _chain(state.key, material)
            self._in_image(image, "wd-" + key[:24], lambda files: files.mkdir(image.workdir or "/"), owner)
            state.key = key
            return
        elif isinstance(op, Run):
            argv = [*state.shell, op.command] if isinstance(op.command, str) else list(op.command)
            env = {**state.args, **image.env}
            material = material or {"run": argv, "env": env, "user": image.user, "workdir": image.workdir}
            state.key = _chain(state.key, material)
            layer_id = "run-" + state.key[:24]
            if not self.layers.exists(layer_id):
                self._run(image, layer_id, argv, state.args, say, op)
            image.layers.insert(0, layer_id)
            return
        state.key = _chain(state.key, material)

    def _copy(self, template: SandboxTemplate, plan: Plan, state: _State, op: Copy, built: dict[int, _State],
              say: Progress, inputs: _Inputs) -> None:
        image = state.image
        instruction = "ADD" if op.extract else "COPY"
        where = f"{op.where()}{instruction}" + (f" --from={op.source}" if op.source else "")
        dest = state.expand(op.dest)
        if not dest.startswith("/"):
            dest = f"{(image.workdir or '/').rstrip('/')}/{dest}"
        owner = state.expand(op.owner) if op.owner else (template.spec.user if plan.escape is None else None)
        account = accounts.resolve(self.layers.stack_paths(image.layers), owner) if owner else None
        mode = int(state.expand(op.mode), 8) if op.mode else None
        patterns = [state.expand(source) for source in op.sources]
        with self._source_root(template, plan, op, built, say, inputs) as (root, origin):
            ignore = dockerignore(root) if origin is None and plan.escape is not None else None
            sources = Sources(root, ignore, where, "build context" if origin is None else "stage's files")
            with self._mounted(image.layers) as (rootfs, upper):
                writer = Writer(rootfs, image.workdir or "/", (account.uid, account.gid) if account else None, mode)
                entries = sources.select(patterns, dest, writer.is_dir)
                material = op.material or {"copy": patterns, "dest": dest, "owner": owner, "mode": op.mode,
                                           "extract": op.extract}
                key = _chain(_chain(state.key, material), origin or sources.digest(entries))
                layer_id = "cp-" + key[:24]
                if not self.layers.exists(layer_id):
                    say(f"{where}: {len(entries)} entries into {dest}")
                    self._write(writer, sources, entries, op.extract, dest, say)
                    mounts.umount(rootfs)
                    self.layers.commit(layer_id, upper)
        image.layers.insert(0, layer_id)
        state.key = key

    def _write(self, writer: Writer, sources: Sources, entries: list[Entry], extract: bool, dest: str,
               say: Progress) -> None:
        for entry in entries:
            unpacked = extract and entry.kind == "file" and entry.follow and \
                writer.extract(sources, entry, dest.rstrip("/") or "/", say)
            if not unpacked:
                writer.copy(sources, [entry])

    @contextmanager
    def _source_root(self, template: SandboxTemplate, plan: Plan, op: Copy, built: dict[int, _State],
                     say: Progress, inputs: _Inputs) -> Iterator[tuple[Path, str | None]]:
        """Where a copy reads: the build context, or (`--from`) a stage's or image's root, mounted, and what
        names that root in the cache key (None for the context, whose content is hashed instead)."""
        if op.source is None:
            context = build_context(template)
            if not context.is_dir():
                raise InvalidResource(f"{op.where()}the build context {context} is not a directory")
            yield context, None
            return
        found = plan.stage_index(op.source, None)
        if found is not None and found not in built:
            raise InvalidResource(f"{op.where()}COPY --from={op.source}: that stage comes later: stages can copy from "
                                  "earlier stages only")
        image = built[found].image if found is not None else self._image(op.source, say, inputs, op.line)
        with self._mounted(image.layers) as (rootfs, upper):
            try:
                yield rootfs, _layers_key(image)
            finally:
                mounts.umount(rootfs)
                remove_tree(upper)

    # -- layers -----------------------------------------------------------------------------

    @contextmanager
    def _mounted(self, layers: list[str]) -> Iterator[tuple[Path, Path]]:
        """An image's root, mounted over its layers, and the upper directory that takes what is written there (the
        caller commits it as a layer, or it is removed)."""
        bundle = self.work_dir / f"copy-{secrets.token_hex(6)}"
        rootfs, work = bundle / "rootfs", bundle / "work"
        rootfs.mkdir(parents=True)
        work.mkdir()
        upper = self.layers.staging("copy")
        try:
            mounts.mount_overlay(rootfs, self.layers.stack_paths(layers), upper, work)
            yield rootfs, upper
        finally:
            mounts.umount(rootfs)
            remove_tree(bundle)
            remove_tree(upper)

    def _in_image(self, image: Image, layer_id: str, fill: Callable[[ContainerFiles], None], owner: str) -> None:
        """A layer made by writing into the image's root as `owner` (inside the root: its links stay its own)."""
        if not self.layers.exists(layer_id):
            account = accounts.resolve(self.layers.stack_paths(image.layers), owner)
            with self._mounted(image.layers) as (rootfs, upper):
                fill(ContainerFiles(str(rootfs), "/", account.uid, account.gid, max_upload=2**63 - 1))
                mounts.umount(rootfs)
                self.layers.commit(layer_id, upper)
        image.layers.insert(0, layer_id)

    def _ensure_layer(self, layer_id: str, fill: Callable[[Path], None]) -> None:
        if not self.layers.exists(layer_id):
            staged = self.layers.staging(layer_id)
            try:
                fill(staged)
            except BaseException:
                remove_tree(staged)
                raise
            self.layers.commit(layer_id, staged)

    def _run(self, image: Image, layer_id: str, argv: list[str], args: dict[str, str], say: Progress,
             op: Op) -> None:
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
            env = {"HOME": account.home, "DEBIAN_FRONTEND": "noninteractive", **args, **image.env}
            spec = container_spec(ContainerConfig(
                args=argv, cgroups_path=self.cgroups.path_for(name), limits=BUILD_LIMITS,
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
            what = f"RUN {json.dumps(argv)}" if op.line is not None else f"run: {argv[-1]}"
            raise BuildFailed(f"{op.where()}step `{what}` failed with exit code {code}:\n{shown}",
                              exit_code=code, output=output)
        self.layers.commit(layer_id, upper)

    def _ensure_account(self, image: Image, user: str, key: str) -> None:
        """Adds the default unprivileged account (uid 1000) to images that lack it."""
        lowers = self.layers.stack_paths(image.layers)
        try:
            accounts.resolve(lowers, user)
            return
        except InvalidRequest:
            if user != DEFAULT_USER:
                raise
        layer_id = "acct-" + _chain(key, DEFAULT_USER)[:24]

        def fill(files: ContainerFiles) -> None:
            for name, line in (("passwd", "user:x:1000:1000:user:/home/user:/bin/sh\n"),
                               ("group", "user:x:1000:\n")):
                text = accounts.read_in_layers(lowers, f"etc/{name}") or ""
                files.write(f"/etc/{name}", text + ("" if text.endswith("\n") or not text else "\n") + line)
            files.mkdir("/home")
            home = ContainerFiles(files.root, "/", 1000, 1000, files.max_upload)
            home.mkdir("/home/user")
            home.chmod("/home/user", 0o755)

        self._in_image(image, layer_id, fill, "0")


def _stage_name(plan: Plan, index: int) -> str:
    if len(plan.stages) == 1:
        return ""
    return f"stage {plan.stages[index].name or index}: "


def _arg_value(arg: Arg, spec: TemplateSpec, variables: dict[str, str], escape: str | None,
               global_args: dict[str, str] | None = None) -> str | None:
    """A build arg given for the build, else the ARG's default, else (redeclared in a stage) the global ARG's."""
    if arg.name in spec.build_args:
        return spec.build_args[arg.name]
    if arg.default is not None:
        return str(dockerfile.expand(arg.default, variables, escape))
    return (global_args or {}).get(arg.name)


def _layers_key(image: Image) -> str:
    return hashlib.sha256(json.dumps(image.layers).encode()).hexdigest()


def _chain(key: str, value: object) -> str:
    return hashlib.sha256((key + json.dumps(value, sort_keys=True)).encode()).hexdigest()
