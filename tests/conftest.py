"""Shared fixtures: real engines on throw-away data directories, cleaned up to the last mount."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Engine, mounts
from rollbox.spec import SandboxTemplate

BASIC = {"metadata": {"name": "basic"}, "spec": {"steps": [{"run": "mkdir -p /opt/data && echo baseline > /opt/data/file"}]}}


def make_engine(root: Path) -> Engine:
    return Engine(root / "data", run_dir=f"/run/rollbox/test-{secrets.token_hex(4)}")


def teardown_engine(engine: Engine) -> None:
    """Deletes everything the engine made, then checks that nothing of it is left on the machine."""
    engine.destroy_all()
    engine.close()
    for point in mounts.mounted_under(engine.data_dir):
        mounts.umount(point, lazy=True)
    engine.cgroups.remove_all()
    shutil.rmtree(engine.run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine for the whole session, with the `basic` template built on the host base."""
    engine = make_engine(tmp_path_factory.mktemp("engine"))
    engine.build(SandboxTemplate.model_validate(BASIC))
    yield engine
    teardown_engine(engine)


@pytest.fixture
def sandbox(engine: Engine) -> Iterator:
    with engine.create("basic") as box:
        yield box
