"""`rollbox build` and Dockerfile templates through the API: the build context travels with the request (the
server reads none of the client's files), .dockerignore is honoured on the client's side, refusals are one line.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

import httpx
import pytest
import yaml

from rollbox.client import SandboxClient
from tests.e2e.test_cli import one_line_error, rollbox
from tests.support.images import busybox_layout

DOCKERFILE = """\
ARG BASE
FROM ${BASE} AS build
RUN /bin/busybox --install -s /bin && mkdir /out && echo "built with $FLAVOUR" > /out/made.txt
ARG FLAVOUR=plain
RUN echo "$FLAVOUR" > /out/flavour.txt

FROM build
WORKDIR /app
COPY --from=build /out/ ./
COPY src/ src/
ENTRYPOINT ["sh", "-c"]
CMD ["cat made.txt"]
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"oci:{busybox_layout(tmp_path_factory.mktemp('image'))}:base"


def test_rollbox_build_sends_the_context_and_honours_dockerignore(url: str, base: str, tmp_path: Path) -> None:
    context = tmp_path / "project"
    (context / "src").mkdir(parents=True)
    (context / "src" / "main.py").write_text("print('hi')\n")
    (context / "src" / "local.env").write_text("SECRET=1\n")
    (context / ".dockerignore").write_text("**/*.env\n")
    (tmp_path / "Dockerfile.prod").write_text(DOCKERFILE)
    done = rollbox("build", "-f", str(tmp_path / "Dockerfile.prod"), "-t", "cli-built", "--build-arg",
                   f"BASE={base}", "--build-arg", "FLAVOUR=spicy", str(context), url=url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["template/cli-built created"]
    (info,) = json.loads(rollbox("get", "template", "cli-built", "-o", "json", url=url).stdout)
    assert info["config"] == {"entrypoint": ["sh", "-c"], "cmd": ["cat made.txt"]}
    assert info["spec"]["buildArgs"] == {"BASE": base, "FLAVOUR": "spicy"}
    with SandboxClient(url, token="alice-token") as client, client.create_sandbox(template="cli-built") as box:
        result = box.run("pwd; cat made.txt flavour.txt; ls src")
    assert result.stdout.split() == ["/app", "built", "with", "spicy", "main.py"]
    again = rollbox("build", "-f", str(tmp_path / "Dockerfile.prod"), "-t", "cli-built", "--build-arg",
                    f"BASE={base}", "--build-arg", "FLAVOUR=spicy", str(context), url=url)
    assert again.stdout.splitlines() == ["template/cli-built unchanged"]


def test_the_context_travels_with_the_request(url: str, base: str) -> None:
    """The files exist nowhere on the server's machine: only in the request."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        data = b"only in the request\n"
        info = tarfile.TarInfo("payload/note.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    document = {"kind": "SandboxTemplate", "metadata": {"name": "travelled"},
                "spec": {"dockerfile": "Dockerfile.nowhere", "buildArgs": {"BASE": base}}}
    dockerfile = "ARG BASE\nFROM ${BASE}\nRUN /bin/busybox --install -s /bin\nCOPY payload /opt/payload\n"
    body = {"documents": [document], "contexts": {"travelled": {
        "archive": base64.b64encode(archive.getvalue()).decode(), "dockerfile": dockerfile}}}
    events = _apply(url, body)
    assert events[-2:] == [{"event": "applied", "kind": "SandboxTemplate", "name": "travelled", "status": "created"},
                           {"event": "done"}]
    with SandboxClient(url, token="alice-token") as client, client.create_sandbox(template="travelled") as box:
        assert box.run("cat /opt/payload/note.txt").stdout == "only in the request\n"


def test_a_template_that_reads_files_needs_its_context(url: str) -> None:
    document = {"kind": "SandboxTemplate", "metadata": {"name": "no-context"}, "spec": {"dockerfile": "Dockerfile"}}
    answer = _post(url, {"documents": [document]})
    assert answer.status_code == 400 and "send its build context" in answer.json()["error"]["message"]
    bogus = {"documents": [document], "contexts": {"no-context": {"archive": base64.b64encode(b"not a tar").decode()}}}
    answer = _post(url, bogus)
    assert answer.status_code == 400 and "not a tar archive" in answer.json()["error"]["message"]


def test_refused_instructions_are_one_line_errors(url: str, base: str, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN true\nADD https://example.invalid/app.tgz /opt/\n")
    line = one_line_error(rollbox("build", "-t", "cli-refused", str(tmp_path), url=url))
    assert "line 3: ADD of a URL (https://example.invalid/app.tgz) is not supported" in line
    template = {"apiVersion": "rollbox.dev/v1alpha1", "kind": "SandboxTemplate", "metadata": {"name": "yaml-built"},
                "spec": {"dockerfile": "Dockerfile", "steps": [{"run": "true"}]}}
    assert "takes its base and steps from the Dockerfile" in one_line_error(
        rollbox("apply", "-f", "-", url=url, stdin=yaml.safe_dump(template)))


def _post(url: str, body: dict[str, object]) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=url.removeprefix("unix://"))
    with httpx.Client(transport=transport, base_url="http://rollbox", timeout=300,
                      headers={"Authorization": "Bearer alice-token"}) as http:
        return http.post("/v1/apply", json=body)


def _apply(url: str, body: dict[str, object]) -> list[dict[str, object]]:
    answer = _post(url, body)
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines()]
