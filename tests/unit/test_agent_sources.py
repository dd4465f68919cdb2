"""The exec agent is built from its C sources on the machine that runs it, so an installed rollbox must carry
every file its build reads (pyproject's package-data), and the build must compile every C file of the agent."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import rollbox
from rollbox.engine import agent

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def test_every_file_the_agent_build_reads_ships_with_the_package() -> None:
    shipped = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]["rollbox"]
    package = Path(rollbox.__file__).parent
    for path in (*agent.AGENT_SOURCES, *agent.AGENT_HEADERS, agent.COMPAT_SOURCE,
                 *agent.DETERMINISM_SOURCES):
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch(relative, pattern) for pattern in shipped), f"{relative} is not in package-data"


def test_the_agent_build_compiles_every_c_file_beside_it() -> None:
    library = {path.name for path in (agent.COMPAT_SOURCE, *agent.DETERMINISM_SOURCES)}
    beside = {path.name for path in agent.HERE.glob("*.[ch]")} - library
    assert beside == {path.name for path in (*agent.AGENT_SOURCES, *agent.AGENT_HEADERS)}
