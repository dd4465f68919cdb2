"""The attack suite's fixtures: one engine, the attacker's sandbox, its neighbour and the host's evidence."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.engine import Container, Engine
from rollbox.spec import SandboxTemplate
from tests.attacks.attack_support import (
    BASELINE,
    LIMITS,
    RUNTIMES,
    Host,
    Neighbour,
    host_hashes,
    new_sandbox,
    template_name,
)
from tests.support.engines import make_engine, teardown_engine


@pytest.fixture(scope="session")
def attack_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine for the attack suite, with the same small template built for each installed runtime."""
    engine = make_engine(tmp_path_factory.mktemp("attacks"))
    for runtime in RUNTIMES:
        if shutil.which(runtime):
            engine.build(SandboxTemplate.model_validate({
                "metadata": {"name": template_name(runtime)},
                "spec": {"runtime": runtime, "limits": LIMITS.model_dump(),
                         "steps": [{"run": f"mkdir -p /opt/data && printf '{BASELINE}' > /opt/data/file"}]},
            }))
    yield engine
    teardown_engine(engine)


@pytest.fixture(scope="session", params=[pytest.param("runc", id="runc"),
                                         pytest.param("runsc", id="runsc", marks=pytest.mark.runsc)])
def runtime_name(request: pytest.FixtureRequest) -> str:
    if shutil.which(request.param) is None:
        pytest.skip(f"{request.param} is not installed")
    return request.param


@pytest.fixture
def box(attack_engine: Engine, runtime_name: str) -> Iterator[Container]:
    """The attacker's sandbox."""
    with new_sandbox(attack_engine, runtime_name) as sandbox:
        yield sandbox


@pytest.fixture(scope="session")
def neighbour(attack_engine: Engine, runtime_name: str) -> Iterator[Neighbour]:
    """One neighbour per runtime for the whole suite: every attack checks it at its end."""
    with new_sandbox(attack_engine, runtime_name) as sandbox:
        token = secrets.token_hex(8)
        result = sandbox.exec(f"echo {token} > /home/user/canary && (nohup sleep 100000 >/dev/null 2>&1 & echo $!)")
        assert result.exit_code == 0, result
        yield Neighbour(sandbox, token, int(result.stdout))


@pytest.fixture(scope="session")
def host(attack_engine: Engine) -> Iterator[Host]:
    directory = Path(tempfile.mkdtemp(prefix="rollbox-attack-", dir="/tmp"))
    secret = f"host secret {secrets.token_hex(16)}\n".encode()
    (directory / "secret").write_bytes(secret)
    (directory / "victim").write_bytes(b"victim\n")
    root_canary = Path("/root") / f".rollbox-attack-{secrets.token_hex(6)}"
    root_canary.write_bytes(secret)
    evidence = Host(attack_engine, directory, secret, root_canary, host_hashes(), set(os.listdir("/usr/bin")))
    try:
        yield evidence
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        root_canary.unlink(missing_ok=True)
