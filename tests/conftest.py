"""Shared fixtures: real engines on throw-away data directories, cleaned up to the last mount."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine
from rollbox.engine.engine import RUN_ROOT
from rollbox.spec import SandboxTemplate

BASIC = {"metadata": {"name": "basic"},
         "spec": {"steps": [{"run": "mkdir -p /opt/data && echo baseline > /opt/data/file"}]}}


def make_engine(root: Path) -> Engine:
    return Engine(root / "data", run_dir=RUN_ROOT / f"test-{secrets.token_hex(4)}")


def run_dirs() -> set[str]:
    """What RUN_ROOT holds: engines' run directories (and the network lock)."""
    return set(os.listdir(RUN_ROOT)) if RUN_ROOT.is_dir() else set()


def teardown_engine(engine: Engine) -> None:
    """Deletes everything the engine made on the machine."""
    engine.destroy()


RUNTIMES = ["runc", "runsc"]


def template_for(runtime: str) -> str:
    return "basic" if runtime == "runc" else f"basic-{runtime}"


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine for the whole session, with the `basic` template built for each runtime."""
    engine = make_engine(tmp_path_factory.mktemp("engine"))
    for runtime in RUNTIMES:
        document = {**BASIC, "metadata": {"name": template_for(runtime)},
                    "spec": {**BASIC["spec"], "runtime": runtime}}
        engine.build(SandboxTemplate.model_validate(document))
    yield engine
    teardown_engine(engine)


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def sandbox(engine: Engine, runtime: str) -> Iterator:
    """A fresh sandbox of the `basic` template, once under each runtime."""
    with engine.create(template_for(runtime)) as box:
        yield box
