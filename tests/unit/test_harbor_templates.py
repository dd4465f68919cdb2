"""The rules that turn a Harbor task's environment into a rollbox template, without Harbor: its network, the user
Docker would run it as, its name, and the account of a trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rollbox import spec
from rollbox.rl.adapters.harbor import account, templates


def test_harbors_network_modes_become_rollbox_policies() -> None:
    assert templates.network("no-network") == {"mode": "none"}
    assert templates.network("public") == {"mode": "allowlist", "egress": ["0.0.0.0/0"]}
    assert templates.network("allowlist", ["pypi.org", "10.1.0.0/16"], ["10.0.0.53"]) == \
        {"mode": "allowlist", "egress": ["pypi.org", "10.1.0.0/16", {"cidr": "10.0.0.53", "ports": [53]}]}
    assert templates.network("allowlist", []) == {"mode": "none"}
    with pytest.raises(ValueError, match="unknown network mode"):
        templates.network("bridge")
    for mode, hosts in (("public", []), ("allowlist", ["pypi.org", "192.0.2.7"])):
        spec.Network.model_validate(templates.network(mode, hosts, ["10.0.0.53"]))  # rollbox takes each


@pytest.mark.parametrize(("dockerfile", "sets"), [
    ("FROM python:3.11\nRUN true\n", False),
    ("FROM python:3.11\nUSER agent\n", True),
    ("FROM python:3.11 AS build\nUSER builder\nFROM python:3.11\nCOPY --from=build /x /x\n", False),
    ("FROM python:3.11 AS base\nUSER agent\nFROM base\nRUN true\n", True),
    ("FROM python:3.11 AS Base\nUSER agent\nFROM base AS mid\nFROM mid\n", True),
    ("FROM python:3.11\nUSER agent\nFROM 0\n", True),
    ("FROM busybox\nUSER agent\nFROM busybox\n", False),
    ("# no stage\n", False),
])
def test_the_dockerfile_names_the_user_or_docker_runs_it_as_root(dockerfile: str, sets: bool) -> None:
    assert templates.sets_user(dockerfile) is sets


def test_a_template_is_named_by_what_it_is_built_from(tmp_path: Path) -> None:
    public = templates.template_spec(templates.network("public"), "root", "runc")
    offline = templates.template_spec(templates.network("no-network"), "root", "runc")
    name = templates.template_name("0123abcd", public)
    assert name == templates.template_name("0123abcd", dict(reversed(public.items())))
    assert len({name, templates.template_name("0123abce", public), templates.template_name("0123abcd", offline),
                templates.template_name("0123abcd", templates.template_spec(public["network"], None, "runc"))}) == 4
    assert name.startswith("harbor-") and len(name) <= 63

    (tmp_path / "Dockerfile").write_text("FROM python:3.11\n")
    document = templates.template_document(name, public, tmp_path / "Dockerfile", tmp_path)
    (template,) = spec.load_resources(document, "/elsewhere")
    assert template.metadata.name == name and template.spec.user == "root"
    assert template.spec.dockerfile == str(tmp_path / "Dockerfile") and template.spec.context == str(tmp_path)
    assert template.spec.limits.upload == 2**30 and yaml.safe_load(document)["spec"]["network"] == public["network"]
    assert "user" not in templates.template_spec(public["network"], None, "runc")


def test_a_trials_account_counts_what_is_rollboxs_and_not_the_commands(tmp_path: Path) -> None:
    entry = account.Account(template="harbor-x", start_s=1.0, exec_s=3.0, command_s=2.5, upload_s=0.25,
                            download_s=0.125, stop_s=0.125)
    assert entry.rollbox_s == pytest.approx(2.0)
    with entry.timing("upload_s"):
        pass
    entry.write(tmp_path)
    written = account.read(tmp_path)
    assert written is not None and written["template"] == "harbor-x"
    assert written["rollbox_s"] == pytest.approx(entry.rollbox_s)
    assert json.loads((tmp_path / account.FILE).read_text())["command_s"] == 2.5
    assert account.read(tmp_path / "missing") is None
