"""Dockerfiles parsed into build plans: what is refused (naming its line), how FROM names a registry image, how
words expand. No engine: tests/engine/test_dockerfile.py builds them."""

from __future__ import annotations

import re

import pytest

from rollbox.archives import build_context
from rollbox.engine.dockerfile import expand, parse
from rollbox.engine.images.reference import as_base
from rollbox.engine.plan import Arg, Copy, Env, Record, Run, Shell, User, Workdir
from rollbox.errors import InvalidResource
from rollbox.spec import SandboxTemplate


@pytest.mark.parametrize(("line", "instruction", "message"), [
    ("RUN --mount=type=cache,target=/root/.cache pip install x", "RUN --mount", "COPY what the command needs"),
    ("RUN --network=none make", "RUN --network", "host's network"),
    ("ONBUILD RUN make", "ONBUILD", "put the instructions in the Dockerfiles"),
    ("ADD https://example.invalid/x.tar.gz /opt/", "ADD of a URL", "download it into the build context"),
    ("ADD git@example.invalid:repo.git /src", "ADD of a URL", "git clone"),
    ("COPY --link app /app", "COPY --link", "drop --link"),
    ("COPY --exclude=*.pyc app /app", "COPY --exclude", ".dockerignore"),
    ("COPY <<EOF /etc/motd\nhello\nEOF", "COPY <<EOF", "put the file in the build context"),
    ("RUN <<A <<B\na\nA\nb\nB", "this heredoc", "RUN <<EOF"),
    ("COPY a b /not-a-directory", "COPY of several sources", "ending in '/'"),
    ("ADD --chmod=rwx a /a", "--chmod=rwx", "octal"),
    ("SHELL /bin/bash -c", "SHELL in its JSON form only", '["/bin/bash", "-c"]'),
    ("FROM --platform=linux/arm64 other", "FROM --platform", "this machine's platform"),
    ("FETCH something", "FETCH is not an instruction", "docs/dockerfile.md"),
    ("ENV", "ENV needs a value", ""),
])
def test_refused_instructions_name_their_line(line: str, instruction: str, message: str) -> None:
    text = f"# syntax=docker/dockerfile:1\nFROM busybox AS first\nRUN true\n{line}\n"
    with pytest.raises(InvalidResource) as raised:
        parse(text)
    assert f"Dockerfile line 4: {instruction}" in str(raised.value)
    assert message in str(raised.value)


@pytest.mark.parametrize(("text", "message"), [
    ("RUN true\n", "line 1: RUN comes before the first FROM"),
    ("# only a comment\n", "does not parse: file with no instructions"),
    ("ARG A\n", "has no FROM"),
    ("FROM a AS one\nFROM b AS one\n", "line 2: a stage named 'one' comes earlier"),
    ("FROM a AS 1st\n", "line 1: stage name '1st'"),
    ("FROM a b c d\n", "line 1: write FROM <image> [AS <name>]"),
])
def test_malformed_dockerfiles_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidResource, match=re.escape(message)):
        parse(text)


def test_a_dockerfile_becomes_stages_of_steps() -> None:
    plan = parse("""\
ARG BASE=python:3.11
FROM ${BASE} AS build
ENV A=1 B="two words"
RUN ["make", "all"]
RUN <<EOF
set -e
make install
EOF
FROM build
SHELL ["/bin/bash", "-c"]
WORKDIR /app
COPY --from=build --chown=app:app --chmod=0644 /out/ ./
USER app
ARG LEVEL
CMD python -m app
ENTRYPOINT ["tini", "--"]
LABEL a=b
EXPOSE 80/tcp
VOLUME /data
STOPSIGNAL SIGINT
HEALTHCHECK --interval=5s CMD curl -f localhost
""", target="build")
    assert plan.target == 0 and [stage.name for stage in plan.stages] == ["build", None]
    assert plan.global_args == [Arg("BASE", "python:3.11", line=1)]
    build, final = plan.stages
    assert build.base == "${BASE}" and build.line == 2
    assert build.ops == [Env([("A", "1"), ("B", '"two words"')], line=3), Run(["make", "all"], line=4),
                         Run("set -e\nmake install\n", line=5)]
    assert final.ops[:5] == [Shell(["/bin/bash", "-c"], line=10), Workdir("/app", line=11),
                             Copy(["/out/"], "./", owner="app:app", mode="0644", source="build", line=12),
                             User("app", line=13), Arg("LEVEL", None, line=14)]
    records = {op.key: op.value for op in final.ops if isinstance(op, Record)}
    assert records["cmd"] == ["/bin/sh", "-c", "python -m app"] and records["entrypoint"] == ["tini", "--"]
    assert records["healthcheck"] == {"test": ["CMD", "curl -f localhost"], "options": ["--interval=5s"]}
    assert records["labels"] == [("a", "b")] and records["stopSignal"] == ["SIGINT"]
    assert plan.needed() == [0]
    assert parse("FROM a AS x\nFROM b AS y\nCOPY --from=x /a /a\nFROM c\n").needed() == [2]
    assert parse("FROM a AS x\nFROM b AS y\nCOPY --from=x /a /a\nFROM y\n").needed() == [0, 1, 2]


def test_target_must_be_a_stage() -> None:
    with pytest.raises(InvalidResource, match=r"target 'test' is no stage of the Dockerfile \(its named stages: "
                                              r"build\)"):
        parse("FROM a AS build\nFROM b\n", target="test")


@pytest.mark.parametrize(("ref", "base"), [
    ("python:3.11", "docker://docker.io/library/python:3.11"),
    ("python", "docker://docker.io/library/python:latest"),
    ("user/app:1", "docker://docker.io/user/app:1"),
    ("ghcr.io/org/app", "docker://ghcr.io/org/app:latest"),
    ("registry.example:5000/team/app@sha256:" + "a" * 64, "docker://registry.example:5000/team/app@sha256:" + "a" * 64),
    ("localhost/app:dev", "docker://localhost/app:dev"),
    ("docker://quay.io/x/y:z", "docker://quay.io/x/y:z"),
])
def test_from_names_a_registry_image_as_a_docker_base(ref: str, base: str) -> None:
    assert as_base(ref) == base


def test_words_expand_as_docker_expands_them() -> None:
    variables = {"HOME": "/root", "EMPTY": ""}
    assert expand("${HOME}/bin:$PATH", variables, "\\") == "/root/bin:"
    assert expand("${EMPTY:-fallback} ${HOME:+set} '$HOME' \\$HOME", variables, "\\") == "fallback set $HOME $HOME"
    assert expand('"two words"', variables, "\\") == "two words"
    assert expand("$HOME", variables, None) == "$HOME"  # YAML steps are never expanded


def test_a_dockerfile_template_takes_nothing_of_base_and_steps() -> None:
    with pytest.raises(ValueError, match="takes its base and steps from the Dockerfile"):
        SandboxTemplate.model_validate({"metadata": {"name": "x"}, "spec": {"dockerfile": "Dockerfile",
                                                                             "steps": [{"run": "true"}]}})
    with pytest.raises(ValueError, match="context, buildArgs and target go with a dockerfile"):
        SandboxTemplate.model_validate({"metadata": {"name": "x"}, "spec": {"target": "build"}})
    template = SandboxTemplate.model_validate({"metadata": {"name": "x"}, "spec": {
        "dockerfile": "docker/Dockerfile.dev", "buildArgs": {"A": "1"}}, "context_dir": "/srv/app"})
    assert str(build_context(template)) == "/srv/app/docker"
    template.spec.context = "."
    assert str(build_context(template)) == "/srv/app"
