"""Template bases other than `host`, built with the real tools into real sandboxes.

The OCI image is made here without network: Debian's static busybox (and /bin/sh) in one layer,
with env and a working directory in its config, saved as a layout, an oci-archive and a
docker-archive.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine
from rollbox.errors import ImageRefused, InvalidResource
from rollbox.spec import SandboxTemplate
from tests.support.engines import make_engine, teardown_engine
from tests.support.images import busybox_layout
from tests.support.images import run as _run

OCI_FORMS = ("oci", "oci-archive", "docker-archive")
INSTALL_APPLETS = "/bin/busybox --install -s /bin && echo built > /built"
WARM_BUILD_SECONDS = 5.0
"""A cached build only asks skopeo for the manifest and config: far below this."""


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The busybox image as every `base:` form accepts it, plus a bad archive and a second tag."""
    work = tmp_path_factory.mktemp("images")
    layout = busybox_layout(work)
    _run("umoci", "config", "--image", f"{layout}:base", "--tag", "as-1000", "--config.user", "1000:1000")
    _run("skopeo", "copy", "--quiet", f"oci:{layout}:base", f"oci-archive:{work / 'image-oci.tar'}")
    _run("skopeo", "copy", "--quiet", f"oci:{layout}:base", f"docker-archive:{work / 'image-docker.tar'}")
    (work / "bad.tar").write_bytes(b"not a tar at all\n")
    return {"oci": f"oci:{layout}:base", "oci-archive": f"oci-archive:{work / 'image-oci.tar'}",
            "docker-archive": f"docker-archive:{work / 'image-docker.tar'}", "as-1000": f"oci:{layout}:as-1000",
            "layout": str(layout), "bad": str(work / "bad.tar"), "missing": str(work / "missing")}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = make_engine(tmp_path_factory.mktemp("bases"))
    yield engine
    teardown_engine(engine)


def _template(name: str, base: str, run: str) -> SandboxTemplate:
    return SandboxTemplate.model_validate({"metadata": {"name": name}, "spec": {"base": base, "steps": [{"run": run}]}})


def _built_twice(engine: Engine, template: SandboxTemplate) -> tuple[float, float]:
    """Builds `template` cold, then again; checks the second build reused every layer untouched."""
    start = time.monotonic()
    first = engine.build(template)
    cold = time.monotonic() - start
    layers = {layer: engine.layers.path(layer).stat().st_ino for layer in first.layers}
    start = time.monotonic()
    second = engine.build(template)
    warm = time.monotonic() - start
    assert second.layers == first.layers
    assert {layer: engine.layers.path(layer).stat().st_ino for layer in second.layers} == layers
    assert not list(engine.layers.layers.glob(".partial-*"))
    return cold, warm


@pytest.mark.parametrize("form", OCI_FORMS)
def test_oci_base_runs_commands_as_the_sandbox_user(engine: Engine, images: dict[str, str], form: str) -> None:
    template = _template(f"busybox-{form}", images[form], INSTALL_APPLETS)
    cold, warm = _built_twice(engine, template)
    assert warm < WARM_BUILD_SECONDS, f"cached build took {warm:.2f} s (cold {cold:.2f} s)"
    with engine.create(template.metadata.name) as box:
        result = box.exec("id -u; id -g; cat /built; echo $GREETING; pwd")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["1000", "1000", "built", "hello", "/work"]


def test_same_image_in_another_form_is_not_unpacked_again(engine: Engine, images: dict[str, str]) -> None:
    built = [engine.build(_template(f"again-{form}", images[form], "true")) for form in OCI_FORMS]
    base_layers = {image.layers[-1] for image in built}
    assert len(base_layers) == 1 and base_layers.pop().startswith("layer-")


def test_oci_base_takes_settings_from_the_image_config(engine: Engine, images: dict[str, str]) -> None:
    messages: list[str] = []
    pulled = engine.images.local("oci", images["as-1000"].removeprefix("oci:"), messages.append)
    image = pulled.image()
    assert (image.user, image.env, image.workdir) == ("1000:1000", {"GREETING": "hello"}, "/work")
    assert (engine.layers.path(pulled.layers[0]) / "bin" / "busybox").is_file()
    messages.clear()
    again = engine.images.local("oci", images["oci"].removeprefix("oci:"), messages.append)
    assert again.image().user == "0"
    assert again.layers == pulled.layers
    assert not any("to fetch" in message and "0 to fetch" not in message for message in messages), \
        "the same layers, retagged with other settings, were unpacked twice"


@pytest.mark.parametrize(("base", "message"), [
    ("oci:{missing}", "is not an OCI image layout"),
    ("oci:{layout}:no-such-tag", "the tags in .* are: as-1000, base"),
    ("oci-archive:{missing}.tar", "does not exist"),
    ("docker-archive:{bad}", "cannot read the image docker-archive:.*made by `docker save`"),
    ("oci-archive:{bad}", "cannot read the image oci-archive:"),
    ("debian:no-such-suite", "debootstrap does not know the suite 'no-such-suite'"),
    ("debian:", "needs a Debian suite name"),
])
def test_bad_base_says_what_to_do(engine: Engine, images: dict[str, str], base: str, message: str) -> None:
    with pytest.raises(InvalidResource, match=message):
        engine.build(_template("bad", base.format(**images), "true"))
    assert not list(engine.layers.layers.glob(".partial-*"))


def test_broken_image_fails_the_build_and_leaves_no_half_made_layer(engine: Engine, tmp_path: Path) -> None:
    layout, payload = tmp_path / "broken", tmp_path / "payload"
    payload.write_bytes(os.urandom(65536))  # incompressible: the layer is the biggest blob
    _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:base")
    _run("umoci", "insert", "--image", f"{layout}:base", str(payload), "/payload")
    blobs = sorted((layout / "blobs" / "sha256").iterdir(), key=lambda blob: blob.stat().st_size)
    blobs[-1].write_bytes(b"not the layer the manifest names\n")
    before = engine.layers.all_ids()
    with pytest.raises(ImageRefused, match=r"hash to .*refused"):
        engine.build(_template("broken", f"oci:{layout}:base", "true"))
    assert engine.layers.all_ids() == before
    assert not list(engine.layers.layers.glob(".partial-*"))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_debian_base(engine: Engine) -> None:
    template = _template("debian", "debian:bookworm", "echo built > /built")
    cold, warm = _built_twice(engine, template)
    print(f"debian:bookworm cold build {cold:.1f} s, cached {warm * 1000:.0f} ms")
    assert warm < WARM_BUILD_SECONDS
    with engine.create("debian") as box:
        result = box.exec("cat /etc/debian_version; id -u; id -g; cat /built; pwd; test -s /etc/resolv.conf || echo ok")
    assert result.exit_code == 0, result.stderr
    version, uid, gid, built, home, resolv = result.stdout.split()
    assert version.startswith("12.")
    assert (uid, gid, built, home, resolv) == ("1000", "1000", "built", "/home/user", "ok")
    base = engine.layers.path(engine.builder.build(template).layers[-1])
    assert not list((base / "var/lib/apt/lists").glob("*_Packages*"))
    assert not list((base / "dev").iterdir())
