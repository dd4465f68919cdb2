"""E2B's template builds, unmodified SDK against a real `rollbox serve`: `Template` built from steps and from a
Dockerfile, file uploads, status and log polling, failures with their step, `exists`, tags, and who may build.

The base image is made here (busybox in an OCI layout, tests/support/images.py) and named to `from_image` as a
local image: no registry is reached.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import BuildException, Sandbox, Template, TemplateException

from tests.support.e2b import e2b_server
from tests.support.images import busybox_layout
from tests.support.servers import TOKENS

TOOLS = ["/bin/busybox --install -s /bin", "printf '#!/bin/sh\\nexec /bin/sh \"$@\"\\n' > /bin/bash",
         "chmod 755 /bin/bash"]
"""Busybox and a `bash` for the SDK's commands, which run as `bash -l -c`."""


@pytest.fixture(scope="module", autouse=True)
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with e2b_server(tmp_path_factory.mktemp("e2b-templates")) as url:
        yield url


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"oci:{busybox_layout(tmp_path_factory.mktemp('image'))}:base"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "test.txt").write_text("This is a test file.\n")
    (tmp_path / "folder" / "link.txt").symlink_to("test.txt")
    (tmp_path / "folder" / "dangling.txt").symlink_to("no-such-file")
    (tmp_path / "folder" / "notes.tmp").write_text("left out\n")
    (tmp_path / ".dockerignore").write_text("*/*.tmp\n")
    return tmp_path


def test_a_template_built_from_steps_starts_sandboxes(base: str, project: Path) -> None:
    template = (
        Template(file_context_path=str(project))
        .from_image(base)
        .run_cmd(TOOLS, user="root")
        .copy("folder/*", "folder")
        .copy("folder/test.txt", "/opt/tool.sh", mode=0o755, user="root")
        .run_cmd("cat folder/test.txt > copied.txt && whoami > who.txt")
        .set_envs({"GREETING": "hello there", "QUOTED": 'say "hi"'})
        .set_workdir("/app")
        .run_cmd("echo $GREETING > /app/greeting.txt", user="root")
        .set_start_cmd("echo started", "true")
    )
    logs: list[str] = []
    info = Template.build(template, "e2b-steps", cpu_count=1, memory_mb=512,
                          on_build_logs=lambda entry: logs.append(entry.message))
    assert info.template_id == "e2b-steps" and info.tags == ["default"]
    assert any("step" in line for line in logs) and "Build finished" in logs[-1]
    assert Template.exists("e2b-steps") and not Template.exists("e2b-no-such-template")
    sandbox = Sandbox.create(template="e2b-steps")
    try:
        result = sandbox.commands.run(
            "pwd; whoami; cat /home/user/copied.txt /home/user/who.txt /app/greeting.txt; ls /home/user/folder; "
            "readlink /home/user/folder/link.txt; stat -c '%a %u' /opt/tool.sh; echo $QUOTED")
        assert result.stdout.splitlines() == [
            "/app", "user", "This is a test file.", "user", "hello there", "dangling.txt", "link.txt", "test.txt",
            "test.txt", "755 0", 'say "hi"']
    finally:
        sandbox.kill()
    # the same template again: the SDK finds its files uploaded, and the build makes no new layer
    again: list[str] = []
    Template.build(template, "e2b-steps", on_build_logs=lambda entry: again.append(entry.message))
    assert any("Skipping upload of 'folder/*', already cached" in line for line in again)
    assert any("template e2b-steps unchanged" in line for line in again)


def test_a_template_from_a_dockerfile(base: str, project: Path) -> None:
    dockerfile = f"""\
FROM {base}
RUN {' && '.join(TOOLS)}
WORKDIR /srv
COPY folder/test.txt ./
ENV MODE=production
USER user
"""
    template = Template(file_context_path=str(project)).from_dockerfile(dockerfile)
    Template.build(template, "e2b-dockerfile")
    sandbox = Sandbox.create(template="e2b-dockerfile")
    try:
        assert sandbox.commands.run("pwd; whoami; cat test.txt; echo $MODE").stdout.split() == [
            "/srv", "user", "This", "is", "a", "test", "file.", "production"]
    finally:
        sandbox.kill()


def test_a_failing_step_fails_the_build_naming_it(base: str) -> None:
    template = Template().from_image(base).run_cmd(TOOLS, user="root").run_cmd("echo about to fail; exit 3")
    with pytest.raises(BuildException, match="failed with exit code 3") as raised:
        Template.build(template, "e2b-failing")
    assert "about to fail" in str(raised.value)
    info = Template.build_in_background(template, "e2b-failing")
    deadline = time.monotonic() + 60
    while (status := Template.get_build_status(info)).status.value in ("building", "waiting"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert status.status.value == "error" and status.reason is not None and status.reason.step == "2"
    with pytest.raises(TemplateException):
        Template.get_tags("e2b-failing")  # a failed build takes no tag
    with pytest.raises(BuildException, match=r"docker\.io/library/e2b-no-such-image-here"):
        Template.build(Template().from_image("e2b-no-such-image-here"), "e2b-missing-base")


def test_tags_name_builds() -> None:
    Template.build(Template().from_template("e2b-steps"), "e2b-tagged:v1", tags=["candidate"])
    assert sorted(tag.tag for tag in Template.get_tags("e2b-tagged")) == ["candidate", "v1"]
    assigned = Template.assign_tags("e2b-tagged:v1", ["production"])
    assert assigned.tags == ["production"]
    assert {tag.tag: tag.build_id for tag in Template.get_tags("e2b-tagged")}["production"] == assigned.build_id
    Template.remove_tags("e2b-tagged", "candidate")
    assert sorted(tag.tag for tag in Template.get_tags("e2b-tagged")) == ["production", "v1"]
    with pytest.raises(Exception, match="tag"):
        Template.assign_tags("e2b-tagged:v1", ":bad")
    with pytest.raises(TemplateException):
        Template.get_tags("e2b-never-built")
    sandbox = Sandbox.create(template="e2b-tagged:production")
    try:
        assert sandbox.commands.run("cat /app/greeting.txt").stdout == "hello there\n"
    finally:
        sandbox.kill()


def test_only_admins_build_and_uploads_need_their_signature(base: str, project: Path) -> None:
    """A template decides what every sandbox made from it runs: bob, no admin, builds none. An upload link opens
    one tenant's one hash; another tenant never learns that a hash was uploaded."""
    bob = {"api_key": TOKENS["bob"]}
    with pytest.raises(Exception, match="may not change templates"):
        Template.build(Template().from_image(base), "e2b-bobs", **bob)
    with pytest.raises(Exception, match="rollbox names are lowercase"):
        Template.build(Template().from_image(base), "Not_A_Name")
    url = os.environ["E2B_API_URL"]
    digest = hashlib.sha256(b"alice's files").hexdigest()
    with httpx.Client(base_url=url) as http:
        link = http.get(f"/templates/x/files/{digest}", headers={"X-API-KEY": TOKENS["alice"]}).json()
        assert link["present"] is False
        forged = link["url"].replace("token=alice", "token=bob")
        assert http.put(forged, content=b"x").status_code == 401
        assert http.put(link["url"].split("?")[0], content=b"x").status_code == 401
        assert http.put(link["url"], content=b"not even a tar").status_code == 200
        assert http.get(f"/templates/x/files/{digest}", headers={"X-API-KEY": TOKENS["alice"]}).json() == {
            "present": True}
        assert http.get(f"/templates/x/files/{digest}", headers={"X-API-KEY": TOKENS["bob"]}).json()[
            "present"] is False
        answer = http.get("/templates/x/files/not-a-hash", headers={"X-API-KEY": TOKENS["alice"]})
        assert answer.status_code == 400
