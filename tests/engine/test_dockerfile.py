"""Dockerfile builds on a real engine, into real sandboxes: stages, ARG and ENV, COPY and ADD, the layer cache,
.dockerignore, and sources that try to leave the build context.

The base image is made here (busybox in an OCI layout, tests/support/images.py); registry images are the lead's
`docker://` bases, whose translation tests/unit/test_dockerfile.py checks.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine
from rollbox.errors import BuildFailed, InvalidResource
from rollbox.spec import SandboxTemplate
from tests.support.engines import make_engine, teardown_engine
from tests.support.images import busybox_layout

WARM_BUILD_SECONDS = 5.0
APPLETS = "/bin/busybox --install -s /bin"
MULTI_STAGE = f"""\
# a comment before the first line that counts
ARG BASE
FROM ${{BASE}} AS build
ARG WORD=hello
ENV APP_DIR=/opt/app
RUN {APPLETS} && mkdir -p $APP_DIR && echo "$WORD from build" > $APP_DIR/made.txt

FROM ${{BASE}} AS final
RUN {APPLETS} && mkdir -p /etc && echo 'app:x:2000:2000:app:/home/app:/bin/sh' > /etc/passwd \\
    && echo 'app:x:2000:' > /etc/group
ARG WORD
ENV TARGET=/srv/${{WORD:-none}} PATH=/usr/local/bin:$PATH
WORKDIR $TARGET
COPY --from=build --chown=app:app /opt/app/made.txt ./
COPY --chmod=0755 tools/ tools/
USER app
CMD ["sh", "-c", "cat made.txt"]
LABEL org.example.word=$WORD
EXPOSE 8080
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = make_engine(tmp_path_factory.mktemp("dockerfile"))
    yield engine
    teardown_engine(engine)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"oci:{busybox_layout(tmp_path_factory.mktemp('image'))}:base"


def _template(name: str, context: Path, text: str, **spec: object) -> SandboxTemplate:
    (context / "Dockerfile").write_text(text)
    document = {"metadata": {"name": name}, "spec": {"dockerfile": "Dockerfile", **spec}}
    return SandboxTemplate.model_validate({**document, "context_dir": str(context)})


def _context(tmp_path: Path) -> Path:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "hello").write_text("#!/bin/sh\necho tool\n")
    return tmp_path


def test_multi_stage_build_with_args_env_workdir_and_user(engine: Engine, base: str, tmp_path: Path) -> None:
    template = _template("multi", _context(tmp_path), MULTI_STAGE, buildArgs={"BASE": base, "WORD": "bonjour"})
    messages: list[str] = []
    image = engine.build(template, messages.append)
    assert image.user == "app" and image.workdir == "/srv/bonjour"
    assert image.config["cmd"] == ["sh", "-c", "cat made.txt"]
    assert image.config["labels"] == {"org.example.word": "bonjour"} and image.config["exposedPorts"] == ["8080"]
    assert any("line 3: FROM oci:" in message for message in messages)
    with engine.create("multi") as box:
        result = box.exec("id -u; pwd; cat made.txt; stat -c '%u %g' made.txt; stat -c %a tools/hello; "
                          "tools/hello; echo $TARGET $GREETING; echo $PATH")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "2000", "/srv/bonjour", "bonjour from build", "2000 2000", "755", "tool", "/srv/bonjour hello",
        "/usr/local/bin:" + image.env["PATH"].split(":", 1)[1]]


def test_rebuild_does_no_work_and_a_change_rebuilds_from_there(engine: Engine, base: str, tmp_path: Path) -> None:
    context = _context(tmp_path)
    template = _template("cached", context, MULTI_STAGE, buildArgs={"BASE": base, "WORD": "cache"})
    first = engine.build(template)
    before = {layer: engine.layers.path(layer).stat().st_ino for layer in engine.layers.all_ids()}
    start = time.monotonic()
    again = engine.build(template)
    assert time.monotonic() - start < WARM_BUILD_SECONDS
    assert again.layers == first.layers
    assert {layer: engine.layers.path(layer).stat().st_ino for layer in engine.layers.all_ids()} == before
    # a changed file in the context: the layers below its COPY stay, that COPY and those above it are new
    (context / "tools" / "hello").write_text("#!/bin/sh\necho changed\n")
    changed = engine.build(template)
    kept = [layer for layer in changed.layers if layer in first.layers]
    assert changed.layers[-len(kept):] == kept and len(kept) >= 3
    assert changed.layers[0] != first.layers[0]
    # a changed instruction (USER) rebuilds nothing below it: USER makes no layer, so only the account check runs
    relabelled = engine.build(_template("cached", context, MULTI_STAGE.replace("EXPOSE 8080", "EXPOSE 9090"),
                                        buildArgs={"BASE": base, "WORD": "cache"}))
    assert relabelled.layers == changed.layers and relabelled.config["exposedPorts"] == ["9090"]


def test_dockerignore_hides_files_from_copy(engine: Engine, base: str, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "keep.py").write_text("kept\n")
    (tmp_path / "src" / "secret.key").write_text("hidden\n")
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "big.js").write_text("x\n")
    (tmp_path / ".dockerignore").write_text("# comment\nnode_modules\n**/*.key\n")
    text = f"FROM {base}\nRUN {APPLETS}\nCOPY . /app/\n"
    engine.build(_template("ignored", tmp_path, text))
    with engine.create("ignored") as box:
        result = box.exec("cd /app && find . -type f | sort")
    assert result.stdout.split() == ["./.dockerignore", "./Dockerfile", "./src/keep.py"]
    with pytest.raises(InvalidResource, match=r"line 2: COPY source 'node_modules/big.js' is not in the build "
                                              r"context \(or .dockerignore leaves it out\)"):
        engine.build(_template("ignored", tmp_path, f"FROM {base}\nCOPY node_modules/big.js /x\n"))


def test_add_unpacks_a_local_tar_and_copies_other_files(engine: Engine, base: str, tmp_path: Path) -> None:
    _tar(tmp_path / "data.tar.gz", {"pkg/a.txt": b"a\n", "pkg/sub/b.txt": b"b\n"}, links={"pkg/link": "a.txt"})
    (tmp_path / "plain.txt").write_text("plain\n")
    text = f"FROM {base}\nRUN {APPLETS}\nADD data.tar.gz /opt/\nADD plain.txt /opt/copied.txt\n"
    engine.build(_template("added", tmp_path, text))
    with engine.create("added") as box:
        result = box.exec("cat /opt/pkg/a.txt /opt/pkg/sub/b.txt /opt/pkg/link /opt/copied.txt")
    assert result.stdout.split() == ["a", "b", "a", "plain"]


def test_from_scratch_and_from_another_template(engine: Engine, base: str, tmp_path: Path) -> None:
    engine.build(_template("parent", tmp_path, f"FROM {base}\nRUN {APPLETS} && echo parent > /parent\n"))
    (tmp_path / "child.txt").write_text("child\n")
    # a template's image runs as its user (`user`, unless it says otherwise), as an image with USER does
    child = "FROM parent\nCOPY child.txt /\nRUN id -u > /tmp/uid\nUSER root\nRUN cat /parent /child.txt > /both\n"
    engine.build(_template("child", tmp_path, child.replace("/tmp/uid", "/home/user/uid")))
    with engine.create("child") as box:
        assert box.exec("cat /both /home/user/uid; id -u").stdout.split() == ["parent", "child", "1000", "0"]
    scratch = f"FROM {base} AS tools\nRUN {APPLETS}\nFROM scratch\nCOPY --from=tools /bin /bin\nCOPY child.txt /\n"
    image = engine.build(_template("scratch", tmp_path, scratch))
    with engine.create("scratch") as box:
        assert box.exec("cat /child.txt; id -u").stdout.split() == ["child", "1000"]
    assert image.user == "user"


def test_a_failing_run_names_its_line(engine: Engine, base: str, tmp_path: Path) -> None:
    with pytest.raises(BuildFailed, match=r"line 3: step `RUN \[\"/bin/sh\", \"-c\", \"exit 3\"\]` failed with "
                                          r"exit code 3"):
        engine.build(_template("failing", tmp_path, f"FROM {base}\nRUN {APPLETS}\nRUN exit 3\n"))


# -- sources that try to leave the build context -----------------------------------------------


def test_copy_of_a_parent_path_is_refused(engine: Engine, base: str, tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (tmp_path / "outside.txt").write_text("host file\n")
    for source in ("../outside.txt", "sub/../../outside.txt"):
        with pytest.raises(InvalidResource, match=rf"line 2: COPY source '{source}' leaves the build context"):
            engine.build(_template("escape", context, f"FROM {base}\nCOPY {source} /x\n"))


def test_a_symlink_out_of_the_context_stays_inside_it(engine: Engine, base: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    context = tmp_path / "context"
    (context / "dir").mkdir(parents=True)
    (context / "absolute").symlink_to(secret)
    (context / "relative").symlink_to("../secret.txt")
    (context / "dir" / "up").symlink_to("../..")
    for source in ("absolute", "relative", "dir/up/secret.txt"):
        with pytest.raises(InvalidResource, match="is not in the build context"):
            engine.build(_template("links", context, f"FROM {base}\nCOPY {source} /stolen\n"))
    # copied as part of a tree, a link is copied as a link: it resolves inside the sandbox, to nothing of the host's
    engine.build(_template("links", context, f"FROM {base}\nRUN {APPLETS}\nCOPY . /ctx/\n"))
    with engine.create("links") as box:
        result = box.exec("readlink /ctx/absolute; cat /ctx/absolute /ctx/relative /ctx/dir/up/secret.txt")
    assert result.stdout.splitlines()[0] == str(secret)
    assert "host secret" not in result.stdout


def test_add_of_a_tar_that_climbs_out_is_refused(engine: Engine, base: str, tmp_path: Path) -> None:
    _tar(tmp_path / "evil.tar", {"../../escaped.txt": b"out\n"})
    before = engine.layers.all_ids()
    with pytest.raises(InvalidResource, match=r"line 2: ADD: the archive's member '../../escaped.txt' climbs out"):
        engine.build(_template("evil", tmp_path, f"FROM {base}\nADD evil.tar /opt/\n"))
    assert engine.layers.all_ids() == before
    assert not list(engine.layers.layers.glob(".partial-*"))
    assert not list(engine.layers.layers.rglob("escaped.txt"))


def test_add_of_a_tar_writing_through_its_own_symlink_stays_in_the_image(engine: Engine, base: str,
                                                                         tmp_path: Path) -> None:
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    _tar(tmp_path / "links.tar", {"out/planted.txt": b"planted\n"}, links={"out": str(host_dir)})
    with pytest.raises(InvalidResource, match=r"line 3: ADD: the archive's member 'out/planted\.txt'"):
        engine.build(_template("tarlink", tmp_path, f"FROM {base}\nRUN {APPLETS}\nADD links.tar /opt/\n"))
    assert not (host_dir / "planted.txt").exists()
    # where the link's target exists in the image, the member lands there, in the image
    text = f"FROM {base}\nRUN {APPLETS} && mkdir -p {host_dir}\nADD links.tar /opt/\n"
    engine.build(_template("tarlink", tmp_path, text))
    assert not (host_dir / "planted.txt").exists()
    with engine.create("tarlink") as box:
        assert box.exec(f"cat {host_dir}/planted.txt").stdout == "planted\n"


def _tar(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> None:
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    os.chmod(path, 0o644)
