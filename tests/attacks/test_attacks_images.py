"""Attacks carried by an image: a layer is data from outside, and nothing in it may reach this machine.

Each hostile layer is pushed to a real registry on loopback and pulled by a real engine: members that climb out
with `..`, through a link the layer made, or as a hard link to a host file; device nodes; overlay's own extended
attributes; a decompression bomb; a setuid binary, run in a sandbox under each runtime; and the registry password
looked for inside the sandbox it pulled for.
"""

from __future__ import annotations

import os
import secrets
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine
from rollbox.engine.images.registry import RegistrySettings
from rollbox.errors import ImageRefused
from tests.attacks.attack_support import RUNTIMES
from tests.support.engines import RUN_ROOT, teardown_engine
from tests.support.registry import (
    BUSYBOX,
    ImageMaker,
    Layer,
    Registry,
    busybox_layer,
    make_layer,
    module_registry,
    raw_layer,
)

PASSWORD = "attack-" + secrets.token_hex(12)
CANARY = Path("/tmp/rollbox-image-canary")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from module_registry(tmp_path_factory, {"mallory": PASSWORD})


@pytest.fixture(scope="module")
def engine(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = Engine(tmp_path_factory.mktemp("image-attacks") / "data", run_dir=RUN_ROOT / f"test-imgatk-{os.getpid()}",
                    registries=RegistrySettings(insecure=frozenset({registry.host}), max_image_bytes=64 * 2**20))
    yield engine
    teardown_engine(engine)


@pytest.fixture(scope="module")
def maker(tmp_path_factory: pytest.TempPathFactory) -> ImageMaker:
    return ImageMaker(tmp_path_factory.mktemp("hostile"))


def _member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = kind, 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def _layer_id(layer: Layer) -> str:
    return "layer-" + layer.diff_id.split(":", 1)[1][:32]


def _pull(engine: Engine, registry: Registry, maker: ImageMaker, tag: str, layer: Layer) -> str:
    maker.image(tag, [busybox_layer(), layer])
    reference = registry.push(maker, tag, f"hostile/{tag}", as_tag="1")
    return engine.image_template(engine.images.pull(reference, {registry.host: ("mallory", PASSWORD)}))


@pytest.mark.parametrize(("tag", "members"), [
    ("dotdot", [(_member("../../../../../../tmp/rollbox-image-canary"), b"pwned")]),
    ("through-own-link", [(_member("out", tarfile.SYMTYPE, linkname="/tmp"), None),
                          (_member("out/rollbox-image-canary"), b"pwned")]),
    ("through-relative-link", [(_member("up", tarfile.SYMTYPE, linkname="../../../../../../../.."), None),
                               (_member("up/tmp/rollbox-image-canary"), b"pwned")]),
    ("hardlink-out", [(_member("shadow", tarfile.LNKTYPE, linkname="../../../../../../etc/shadow"), None)]),
])
def test_members_that_climb_out_are_refused(engine: Engine, registry: Registry, maker: ImageMaker, tag: str,
                                            members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    CANARY.unlink(missing_ok=True)
    hostile = raw_layer(members)
    with pytest.raises(ImageRefused, match="outside the image"):
        _pull(engine, registry, maker, tag, hostile)
    assert not CANARY.exists()
    assert not engine.layers.exists(_layer_id(hostile)) and not list(engine.layers.layers.glob(".partial-*"))


def test_absolute_names_and_links_stay_inside(engine: Engine, registry: Registry, maker: ImageMaker) -> None:
    """`/etc/x` is the image's /etc/x, and a hard link to `/etc/shadow` the image's own shadow, never the host's."""
    shadow = os.stat("/etc/shadow")
    template = _pull(engine, registry, maker, "absolute", raw_layer([
        (_member("/etc/shadow"), b"image's own\n"),
        (_member("/etc/linked", tarfile.LNKTYPE, linkname="/etc/shadow"), None)]))
    layer = engine.layers.path(engine.images.get(engine.template(template).spec.base).layers[0])
    linked = os.stat(layer / "etc" / "linked")
    assert (linked.st_dev, linked.st_ino) != (shadow.st_dev, shadow.st_ino)
    assert (layer / "etc" / "linked").read_text() == "image's own\n"
    assert os.stat("/etc/shadow").st_nlink == shadow.st_nlink


def test_devices_and_overlay_attributes_are_dropped(engine: Engine, registry: Registry, maker: ImageMaker) -> None:
    devmem = _member("evil-mem", tarfile.CHRTYPE, devmajor=1, devminor=1)
    opaque = _member("etc/", tarfile.DIRTYPE, mode=0o755)
    opaque.pax_headers = {"SCHILY.xattr.trusted.overlay.opaque": "y", "SCHILY.xattr.trusted.overlay.redirect": "/",
                          "SCHILY.xattr.user.note": "kept"}
    template = _pull(engine, registry, maker, "devices", raw_layer([(devmem, None), (opaque, None)]))
    layer = engine.layers.path(engine.images.get(engine.template(template).spec.base).layers[0])
    assert not (layer / "evil-mem").exists()
    assert os.getxattr(layer / "etc", "user.note") == b"kept"
    assert not [name for name in os.listxattr(layer / "etc") if name.startswith("trusted.")]
    with engine.create(template) as box:
        assert box.exec("cat /etc/passwd | head -1").stdout.startswith("root:")  # lower /etc still shows through


def test_a_decompression_bomb_is_refused(engine: Engine, registry: Registry, maker: ImageMaker) -> None:
    bomb = make_layer({"zeros": bytes(96 * 2**20)}, level=9)  # a few hundred kilobytes that unpack past the cap
    with pytest.raises(ImageRefused, match="cap"):
        _pull(engine, registry, maker, "bomb", bomb)
    assert not engine.layers.exists(_layer_id(bomb)) and not list(engine.layers.layers.glob(".partial-*"))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_setuid_files_of_an_image_give_no_privilege(engine: Engine, registry: Registry, maker: ImageMaker,
                                                    runtime: str) -> None:
    suid = _member("suid/busybox", mode=0o4755, uid=0, gid=0)
    template = _pull(engine, registry, maker, "setuid", raw_layer([(suid, BUSYBOX.read_bytes())]))
    layer = engine.layers.path(engine.images.get(engine.template(template).spec.base).layers[0])
    assert stat.S_IMODE(os.stat(layer / "suid" / "busybox").st_mode) == 0o4755, "the image's own bits are kept"
    with engine.create(template) as box:
        result = box.exec(["/suid/busybox", "id", "-u"], user="1000")
    assert (result.exit_code, result.stdout.strip()) == (0, "1000")


def test_the_registry_password_never_reaches_the_sandbox(engine: Engine, registry: Registry,
                                                         maker: ImageMaker) -> None:
    template = _pull(engine, registry, maker, "plain", make_layer({"hello": "world\n"}))
    with engine.create(template) as box:
        seen = box.exec("env; cat /proc/*/environ /proc/*/cmdline").stdout
        # The password is looked for in halves, so that the command's own text never holds it whole.
        files = box.exec(f"P={PASSWORD[:8]}; Q={PASSWORD[8:]}; "
                         'find / -xdev -type f -exec grep -l "$P$Q" {} + 2>/dev/null; echo done', timeout=60).stdout
    assert PASSWORD not in seen
    assert files == "done\n", f"files holding the password: {files}"
    assert not list((engine.data_dir / "images" / "registry" / "auth").iterdir())
