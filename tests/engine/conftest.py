"""The engine tier: one real engine for the session, with the `basic` template built for each runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollbox.engine import Engine
from rollbox.spec import SandboxTemplate
from tests.support.engines import BASIC, RUNTIMES, make_engine, teardown_engine, template_for


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
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
