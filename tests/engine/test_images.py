"""Registry images in real sandboxes: pulled through skopeo from a real registry on loopback (with basic auth),
unpacked layer by layer into the one layer store, started under runc.

The images are made here (tests.support.registry): a busybox base, and layers with whiteouts and opaque
directories on top of it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine
from rollbox.engine.images.flatten import MAX_IMAGE_LAYERS
from rollbox.engine.images.registry import RegistrySettings
from rollbox.errors import ImageNotFound, ImageRefused
from rollbox.spec import SandboxTemplate
from tests.support.engines import RUN_ROOT, teardown_engine
from tests.support.registry import (
    CuttingProxy,
    ImageMaker,
    Registry,
    busybox_layer,
    index_of,
    make_layer,
    module_registry,
)
from tests.support.swe_images import available, disk_bytes, distinct_blobs, swe_family, unpacked_alone
from tests.support.token_auth import TokenServer

USERS = {"alice": "wonderland"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    yield from module_registry(tmp_path_factory, USERS)


@pytest.fixture(scope="module")
def images(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """References of the pushed images: a base, an app on it (a whiteout and an opaque /etc), a second app sharing
    the base, and a big one for the transport tests."""
    maker = ImageMaker(tmp_path_factory.mktemp("images"))
    base = busybox_layer()
    lower = make_layer({"etc/motd": "lower", "etc/keep": "lower", "var/gone": "soon", "opt/old/file": "old\n"})
    app = make_layer({"app/main.sh": "echo app\n", "var/.wh.gone": b"", "etc/.wh..wh..opq": b"",
                      "etc/passwd": "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
                      "etc/group": "root:x:0:\nuser:x:1000:\n", "etc/motd": "upper\n"})
    maker.image("base", [base])
    maker.image("app", [base, lower, app], env={"PATH": "/bin", "GREETING": "hi"}, workdir="/app")
    maker.image("other", [base, make_layer({"other": "yes"})], user="1000")
    maker.image("big", [base, make_layer({"blob": os.urandom(2 * 2**20)})])
    return {tag: registry.push(maker, tag, f"swe/{tag}", as_tag="1") for tag in ("base", "app", "other", "big")}


@pytest.fixture(scope="module")
def engine(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = Engine(tmp_path_factory.mktemp("images-engine") / "data", run_dir=RUN_ROOT / f"test-img-{os.getpid()}",
                    registries=RegistrySettings(insecure=frozenset({registry.host})))
    yield engine
    teardown_engine(engine)


@pytest.fixture
def alice(registry: Registry) -> dict[str, tuple[str, str]]:
    return {registry.host: ("alice", USERS["alice"])}


def _template(name: str, base: str) -> SandboxTemplate:
    return SandboxTemplate.model_validate({"metadata": {"name": name}, "spec": {"base": base, "user": "root"}})


def test_image_runs_with_its_whiteouts_opaque_directories_and_settings(engine: Engine, images: dict[str, str],
                                                                       alice: dict[str, tuple[str, str]]) -> None:
    lines: list[str] = []
    engine.build(_template("app", f"docker://{images['app']}"), lines.append, alice)
    assert any("3 layers, 3 to fetch" in line for line in lines), lines
    with engine.create("app") as box:
        result = box.exec("pwd; echo $GREETING; cat /etc/motd; ls /etc; test -e /var/gone || echo gone; "
                          "cat /opt/old/file; sh main.sh")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["/app", "hi", "upper", "group", "motd", "passwd", "gone", "old", "app"]


def test_images_share_layers_and_a_second_pull_moves_nothing(engine: Engine, images: dict[str, str],
                                                             alice: dict[str, tuple[str, str]]) -> None:
    first = engine.images.pull(images["base"], alice)
    lines: list[str] = []
    other = engine.images.pull(images["other"], alice, lines.append)
    assert other.layers[-1] == first.layers[-1], "the shared base was unpacked twice"
    assert any("2 layers, 1 to fetch" in line for line in lines), lines
    lines.clear()
    again = engine.images.pull(images["other"], alice, lines.append)
    assert again == other and lines == [], "a cached image went back to the registry for layers"


def test_an_image_starts_as_its_own_user_from_a_claim_template(engine: Engine, images: dict[str, str],
                                                               alice: dict[str, tuple[str, str]]) -> None:
    name = engine.image_template(engine.images.pull(images["other"], alice))
    assert engine.image_template(engine.images.pull(images["other"], alice)) == name
    with engine.create(name) as box:
        result = box.exec("id -u; cat /other")
    assert result.stdout.split() == ["1000", "yes"]


def test_private_image_needs_credentials_even_when_cached(engine: Engine, images: dict[str, str],
                                                          alice: dict[str, tuple[str, str]]) -> None:
    engine.images.pull(images["app"], alice)
    with pytest.raises(ImageNotFound, match="credentials"):
        engine.images.pull(images["app"])
    with pytest.raises(ImageNotFound):
        engine.images.pull(images["app"], {images["app"].split("/")[0]: ("alice", "wrong")})


def test_tampered_blob_is_refused_and_leaves_nothing(engine: Engine, registry: Registry, images: dict[str, str],
                                                     alice: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    maker = ImageMaker(tmp_path)
    layer = make_layer({"payload": os.urandom(256 * 1024)})
    maker.image("tampered", [busybox_layer(), layer])
    reference = registry.push(maker, "tampered", "swe/tampered", as_tag="1")
    blob = registry.blob_file(layer.digest)
    original = blob.read_bytes()
    broken = bytearray(original)
    broken[len(broken) // 2] ^= 0xFF
    blob.write_bytes(bytes(broken))
    before = engine.layers.all_ids()
    try:
        with pytest.raises(ImageRefused, match="hash to"):
            engine.images.pull(reference, alice)
        assert engine.layers.all_ids() == before
        assert not list(engine.layers.layers.glob(".partial-*"))
        assert not any(engine.data_dir.joinpath("build").iterdir())
    finally:
        blob.write_bytes(original)
    assert engine.images.pull(reference, alice).digest == engine.images.get(reference).digest


def test_connection_cut_mid_blob_is_retried(engine: Engine, registry: Registry, images: dict[str, str],
                                            tmp_path: Path) -> None:
    proxy = CuttingProxy(registry.host, cuts=1, after=64 * 1024).start()
    try:
        behind = Engine(tmp_path / "data", run_dir=RUN_ROOT / f"test-cut-{os.getpid()}",
                        registries=RegistrySettings(insecure=frozenset({proxy.host})))
        try:
            pulled = behind.images.pull(images["big"].replace(registry.host, proxy.host),
                                        {proxy.host: ("alice", USERS["alice"])})
            assert len(pulled.layers) == 2
        finally:
            teardown_engine(behind)
    finally:
        proxy.stop()
    assert proxy.blob_requests >= 3, "the cut download was not tried again"


def test_deep_image_is_merged_below_overlay_limits(engine: Engine, registry: Registry,
                                                   alice: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    maker = ImageMaker(tmp_path)
    layers = [busybox_layer(), make_layer({"deep/gone": "x", "deep/dir/old": "x"})]
    layers += [make_layer({f"deep/{n}": str(n)}) for n in range(MAX_IMAGE_LAYERS + 10)]
    layers.append(make_layer({"deep/.wh.gone": b"", "deep/dir/.wh..wh..opq": b"", "deep/dir/new": "y"}))
    maker.image("deep", layers)
    reference = registry.push(maker, "deep", "swe/deep", as_tag="1")
    engine.build(_template("deep", f"docker://{reference}"), credentials=alice)
    assert len(engine.images.get(reference).layers) == MAX_IMAGE_LAYERS
    with engine.create("deep") as box:
        result = box.exec(f"ls /deep | wc -l; test -e /deep/gone || echo gone; ls /deep/dir; "
                          f"cat /deep/{MAX_IMAGE_LAYERS}")
    assert result.stdout.split() == [str(MAX_IMAGE_LAYERS + 10 + 1), "gone", "new", str(MAX_IMAGE_LAYERS)]


PULL_AND_DIE = """
import sys
from pathlib import Path
from rollbox.engine import Engine
from rollbox.engine.images.registry import RegistrySettings
data, run, reference, host, user, password = sys.argv[1:]
engine = Engine(Path(data), run_dir=run, registries=RegistrySettings(insecure=frozenset({host})))
engine.images.pull(reference, {host: (user, password)}, lambda line: print(line, flush=True))
"""


def test_a_pull_killed_midway_leaves_nothing_half_used(registry: Registry, images: dict[str, str],
                                                       tmp_path: Path) -> None:
    proxy = CuttingProxy(registry.host, cuts=0, pause=0.02).start()
    data, run = tmp_path / "data", str(RUN_ROOT / f"test-kill-{os.getpid()}")
    reference = images["big"].replace(registry.host, proxy.host)
    try:
        pulling = subprocess.Popen([sys.executable, "-c", PULL_AND_DIE, str(data), run, reference, proxy.host,
                                    "alice", USERS["alice"]], stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
        assert pulling.stdout is not None
        for line in pulling.stdout:
            if "layer 2/2" in line and "MB/s" in line:  # the big layer is on its way
                break
        pulling.kill()
        pulling.wait()
        engine = Engine(data, run_dir=run, registries=RegistrySettings(insecure=frozenset({proxy.host})))
        try:
            assert not list(engine.layers.layers.glob(".partial-*"))
            assert not any((data / "build").iterdir())
            assert not list((data / "images" / "registry" / "auth").iterdir()), "a credentials file outlived its pull"
            proxy.pause = 0.0
            pulled = engine.images.pull(reference, {proxy.host: ("alice", USERS["alice"])})
            with engine.create(engine.image_template(pulled)) as box:
                assert box.exec("wc -c < /blob").stdout.strip() == str(2 * 2**20)
        finally:
            teardown_engine(engine)
    finally:
        proxy.stop()


def test_mirror_and_the_operators_auth_file(registry: Registry, images: dict[str, str], tmp_path: Path) -> None:
    """An image of a registry this machine cannot reach comes from its mirror, with the credentials of the
    operator's docker config.json."""
    auth = tmp_path / "config.json"
    token = base64.b64encode(f"alice:{USERS['alice']}".encode()).decode()
    auth.write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
    settings = RegistrySettings(auth_file=auth, mirrors={"registry.invalid": (registry.host,)},
                                insecure=frozenset({registry.host}))
    behind = Engine(tmp_path / "data", run_dir=RUN_ROOT / f"test-mirror-{os.getpid()}", registries=settings)
    try:
        pulled = behind.images.pull(images["other"].replace(registry.host, "registry.invalid"))
        assert pulled.name.startswith("registry.invalid/swe/other")
        with behind.create(behind.image_template(pulled)) as box:
            assert box.exec("cat /other").stdout == "yes"
    finally:
        teardown_engine(behind)


def test_a_dockerfile_builds_from_and_copies_from_private_registry_images(
        engine: Engine, images: dict[str, str], alice: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {images['app']}\nCOPY --from={images['other']} /other /copied\n"
                                         "RUN echo built > /built\n")
    template = SandboxTemplate.model_validate({"metadata": {"name": "from-registry"},
                                               "spec": {"dockerfile": "Dockerfile", "user": "root"},
                                               "context_dir": str(tmp_path)})
    with pytest.raises(ImageNotFound):
        engine.build(template)
    engine.build(template, credentials=alice)
    with engine.create("from-registry") as box:
        assert box.exec("cat /copied; echo; cat /built; echo $GREETING").stdout.split() == ["yes", "built", "hi"]


def test_bearer_token_auth(tmp_path: Path) -> None:
    """A registry that sends clients to a token server, as Docker Hub does: credentials buy a token that pulls."""
    tokens = TokenServer(tmp_path, USERS)
    registry = Registry(tmp_path / "registry", dict(USERS), auth=tokens.registry_config()).start()
    try:
        maker = ImageMaker(tmp_path / "made")
        maker.image("tokened", [busybox_layer(), make_layer({"tokened": "yes\n"})])
        reference = registry.push(maker, "tokened", "swe/tokened", as_tag="1")
        engine = Engine(tmp_path / "data", run_dir=RUN_ROOT / f"test-token-{os.getpid()}",
                        registries=RegistrySettings(insecure=frozenset({registry.host})))
        try:
            with pytest.raises(ImageNotFound):
                engine.images.pull(reference)
            pulled = engine.images.pull(reference, {registry.host: ("alice", USERS["alice"])})
            with engine.create(engine.image_template(pulled)) as box:
                assert box.exec("cat /tokened").stdout == "yes\n"
        finally:
            teardown_engine(engine)
        assert "alice" in tokens.issued and "" in tokens.issued
    finally:
        registry.stop()
        tokens.stop()


def test_an_index_gives_this_machines_platform(engine: Engine, registry: Registry, tmp_path: Path,
                                               alice: dict[str, tuple[str, str]]) -> None:
    maker = ImageMaker(tmp_path)
    maker.image("for-amd64", [busybox_layer(), make_layer({"arch": "amd64\n"})])
    maker.image("for-arm64", [busybox_layer(), make_layer({"arch": "arm64\n"})])
    index_of(maker, "multi", {"arm64": "for-arm64", "amd64": "for-amd64"})
    reference = registry.push(maker, "multi", "swe/multi", as_tag="1")
    pulled = engine.images.pull(reference, alice)
    with engine.create(engine.image_template(pulled)) as box:
        assert box.exec("cat /arch").stdout == "amd64\n"


def test_unheld_layers_go_least_recently_used_first_past_the_budget(registry: Registry, images: dict[str, str],
                                                                    tmp_path: Path) -> None:
    creds = {registry.host: ("alice", USERS["alice"])}
    budgeted = Engine(tmp_path / "data", run_dir=RUN_ROOT / f"test-budget-{os.getpid()}",
                      registries=RegistrySettings(insecure=frozenset({registry.host})), image_budget=3 * 2**20)
    try:
        held = budgeted.images.pull(images["app"], creds)
        budgeted.build(_template("holds-app", f"docker://{images['app']}"), credentials=creds)  # a template holds it
        budgeted.images.pull(images["other"], creds)
        budgeted.images.pull(images["big"], creds)  # past 3 MiB: what nothing holds goes, oldest first
        kept = {record.digest for record in budgeted.images.images()}
        assert held.digest in kept and all(budgeted.layers.exists(layer) for layer in held.layers)
        assert budgeted.images.pull(images["other"], creds).digest not in kept, "the unheld image stayed"
    finally:
        teardown_engine(budgeted)


@pytest.mark.slow
def test_a_swe_bench_shaped_family_shares_its_layers(registry: Registry, tmp_path: Path) -> None:
    """3 environment images on one base and 20 instance images on each, pulled into one store: each distinct layer
    fetched once and unpacked once, the store's layers no larger than those layers unpacked alone."""
    if not available():
        pytest.skip("needs Debian's python3.11 and git")
    maker = ImageMaker(tmp_path / "made")
    references = swe_family(maker, registry, 3, 20)
    proxy = CuttingProxy(registry.host, cuts=0).start()
    family = Engine(tmp_path / "data", run_dir=RUN_ROOT / f"test-family-{os.getpid()}",
                    registries=RegistrySettings(insecure=frozenset({proxy.host})))
    try:
        for reference in references:
            family.images.pull(reference.replace(registry.host, proxy.host), {proxy.host: ("alice", USERS["alice"])})
        layers = {layer for record in family.images.images() for layer in record.layers}
        assert len(family.images.images()) == 60 and len(layers) == 2 + 3 + 60
        assert max(Counter(proxy.digests).values()) == 1, "a blob was fetched twice"
        on_disk = disk_bytes(*(family.layers.path(layer) for layer in layers))
        alone = unpacked_alone(distinct_blobs(maker, references), tmp_path / "alone")
        assert on_disk <= 1.1 * alone, f"{on_disk} bytes on disk for {alone} bytes of distinct layers"
    finally:
        proxy.stop()
        teardown_engine(family)

