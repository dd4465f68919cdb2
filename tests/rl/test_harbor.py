"""Harbor (the real package, its own `harbor run`) over Harbor-format tasks the tests write, in sandboxes of a real
`rollbox serve`: each task's Dockerfile FROM a base image pushed to a registry on loopback; the oracle solves every
task, Harbor's do-nothing agent none, and an agent of the tests' own tries every call of the environment interface.
Results are Harbor's own files; rollbox's account of each trial lies beside them."""

from __future__ import annotations

import collections
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rollbox.client import SandboxClient
from rollbox.rl.adapters.harbor import account
from tests.support.harbor import (
    ENVIRONMENT,
    ROOT,
    TaskSpec,
    agent,
    harbor_run,
    missing,
    push_base,
    reward,
    rollbox_serve,
    run_flags,
    trial_results,
    write_task,
)
from tests.support.registry import ImageMaker, Registry, running_registry

if missing() is not None and os.environ.get("CI"):
    pytest.fail(f"Harbor's tests always run in CI: this machine {missing()}", pytrace=False)
pytestmark = [pytest.mark.skipif(missing() is not None, reason=str(missing())), pytest.mark.slow]
EXAMPLE = ROOT / "examples" / "harbor"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def base(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tasks' base, also pushed as Docker Hub's python:3.11-slim (the registry is the node's mirror of it)."""
    maker = ImageMaker(tmp_path_factory.mktemp("images"))
    reference = push_base(registry, maker)
    registry.push(maker, "harbor-base", "library/python", as_tag="3.11-slim")
    return reference


@pytest.fixture(scope="module")
def url(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with rollbox_serve(tmp_path_factory.mktemp("serve") / "data", registry.host) as address:
        yield address


@pytest.fixture(scope="module")
def tasks(base: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tasks sharing one environment, one of another, and one without network."""
    root = tmp_path_factory.mktemp("tasks")
    for spec in (TaskSpec("sum-a", 0, 2), TaskSpec("sum-b", 0, 3), TaskSpec("sum-c", 1, 4)):
        write_task(root, base, spec)
    write_task(root, base, TaskSpec("offline", 0, 5), network_mode="no-network")
    return root


def test_oracle_passes_nop_fails_and_every_call_behaves_as_dockers(url: str, tasks: Path, tmp_path: Path) -> None:
    config = {"job_name": "mixed", "jobs_dir": str(tmp_path), "n_concurrent_trials": 4,
              "environment": {"import_path": ENVIRONMENT},
              "agents": [{"name": "oracle"}, {"name": "nop"}, {"import_path": "tests.support.harbor_probe:ProbeAgent"},
                         {"import_path": "tests.support.harbor_probe:LinkPlantingAgent"}],
              "datasets": [{"path": str(tasks)}]}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    done = harbor_run(url, "--config", str(tmp_path / "job.yaml"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    job = tmp_path / "mixed"
    results = trial_results(job)
    assert len(results) == 16
    assert all(result["exception_info"] is None for result in results.values()), \
        [result["exception_info"] for result in results.values() if result["exception_info"]]
    rewards = collections.defaultdict(list)
    for result in results.values():
        rewards[agent(result)].append(reward(result))
    assert rewards == {"oracle": [1.0] * 4, "nop": [0.0] * 4, "rollbox-probe": [1.0] * 4, "rollbox-links": [0.0] * 4}

    # Harbor's own files: the job's summary, each trial's reward, the verifier's output and the oracle's log.
    summary = json.loads((job / "result.json").read_text())
    assert summary["n_total_trials"] == summary["stats"]["n_completed_trials"] == 16
    assert {name: run["metrics"] for name, run in summary["stats"]["evals"].items()} == \
        {f"oracle__{tasks.name}": [{"mean": 1.0}], f"nop__{tasks.name}": [{"mean": 0.0}],
         f"rollbox-probe__{tasks.name}": [{"mean": 1.0}], f"rollbox-links__{tasks.name}": [{"mean": 0.0}]}
    for trial, result in results.items():
        assert (trial / "verifier" / "reward.txt").read_text().strip() == str(int(reward(result) or 0))
        assert (trial / "verifier" / "test-stdout.txt").is_file()
        if agent(result) == "oracle":
            assert (trial / "agent" / "oracle.txt").is_file()
        if agent(result) == "nop":
            assert "no /app/answer.txt" in (trial / "verifier" / "test-stdout.txt").read_text()

    for trial, result in results.items():
        if agent(result) == "rollbox-probe":
            probe = json.loads((trial / "agent" / "probe.json").read_text())
            assert all(probe["checks"].values()), probe["checks"]
            offline = result["task_name"] == "offline"
            assert ("default via" in probe["seen"]["route"]) is not offline, probe["seen"]
        if agent(result) == "rollbox-links":  # what the agent left came down, less the links out of it
            logs = trial / "agent"
            assert (logs / "note.txt").read_text() == "mine\n" and (logs / "inside").readlink() == Path("note.txt")
            assert {path.name for path in logs.iterdir() if path.is_symlink()} == {"inside", "here"}

    # One template per environment and network, built once for all the trials that share it.
    accounts = [account.read(trial) for trial in results]
    assert all(entry is not None for entry in accounts)
    by_template = collections.defaultdict(list)
    for entry in accounts:
        by_template[entry["template"]].append(entry["built"])
    assert sorted(map(len, by_template.values())) == [4, 4, 8]
    assert all(built.count(True) == 1 for built in by_template.values()), by_template
    for entry in accounts:
        assert 0 < entry["command_s"] <= entry["exec_s"] and entry["rollbox_s"] > 0
    with SandboxClient(url) as client:
        assert not client.list_sandboxes(), "a trial's sandbox outlived it"
        assert set(by_template) <= {template.name for template in client.list_templates()}


def test_a_second_job_builds_nothing_and_a_prebuilt_image_runs_as_it_is(url: str, tasks: Path, base: str,
                                                                       tmp_path: Path) -> None:
    """The templates of the first job are the router's: a new Harbor process finds them; a docker_image task
    starts its image with environment/ uploaded into its workdir, as Harbor's Docker environment does. With
    `--no-delete` the sandboxes stay, labelled with their trials, until their `shutdown_after`."""
    shutil.copytree(tasks, tmp_path / "tasks")
    write_task(tmp_path / "tasks", base, TaskSpec("prebuilt", 2, 6), prebuilt=True)
    done = harbor_run(url, *run_flags(tmp_path / "tasks", tmp_path / "jobs", "again", "oracle", 4), "--no-delete",
                      "--ek", "shutdown_after=600")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = trial_results(tmp_path / "jobs" / "again")
    assert {result["task_name"]: reward(result) for result in results.values()} == \
        {"sum-a": 1.0, "sum-b": 1.0, "sum-c": 1.0, "offline": 1.0, "prebuilt": 1.0}
    built = {result["task_name"]: account.read(trial)["built"] for trial, result in results.items()}  # type: ignore[index]
    assert built == {"sum-a": False, "sum-b": False, "sum-c": False, "offline": False, "prebuilt": True}
    with SandboxClient(url) as client:
        kept = client.list_sandboxes()
        assert sorted(sandbox.info.labels["harbor.task"] for sandbox in kept) == sorted(built)
        assert {sandbox.info.labels["harbor.trial"] for sandbox in kept} == \
            {f"{trial.name}__env" for trial in results}
        assert all(sandbox.info.expires_at is not None for sandbox in kept)
        for sandbox in kept:
            sandbox.delete()


def test_a_router_that_does_not_answer_stops_the_job_before_any_trial(tasks: Path, tmp_path: Path) -> None:
    done = harbor_run(f"unix://{tmp_path}/nothing.sock", *run_flags(tasks, tmp_path, "dead", "oracle", 1))
    assert done.returncode != 0
    assert "rollbox does not answer" in done.stdout + done.stderr
    assert not trial_results(tmp_path / "dead")


def test_the_example_task_set_runs_through_harbor(url: str, base: str, tmp_path: Path) -> None:
    """examples/harbor as its README runs it: FROM python:3.11-slim, pulled through the node's Docker Hub mirror."""
    config = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    config |= {"jobs_dir": str(tmp_path), "datasets": [{"path": str(EXAMPLE / "tasks")}],
               "agents": [{"name": "oracle"}, {"name": "nop"}]}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    done = harbor_run(url, "--config", str(tmp_path / "job.yaml"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = trial_results(tmp_path / config["job_name"])
    count = len(list((EXAMPLE / "tasks").iterdir()))
    assert sorted((agent(result), reward(result)) for result in results.values()) == \
        [("nop", 0.0)] * count + [("oracle", 1.0)] * count
