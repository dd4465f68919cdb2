"""What every tier shares. Each tier's own fixtures live in its folder's conftest; helpers in `tests.support`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.openai_server import Scripted

pytest.register_assert_rewrite("tests.support", "tests.attacks.attack_support")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scripted]:
    """A scripted OpenAI-compatible upstream, and a real server whose sandboxes reach it through model gateways."""
    from tests.support.openai_server import scripted_gateway  # a server tier's: the unit tier never loads it

    with scripted_gateway(tmp_path_factory.mktemp("gateway")) as found:
        yield found


SERIAL = ("tests/cluster/", "tests/e2e/test_bench.py", "tests/server/test_server.py::test_64_clients_make_500_claims")
"""What `make test` runs alone, after the rest ran in parallel: clusters (Ray's among them, which cannot share a
machine with another) and chaos whose stalls are bounded, benchmarks that pin CPUs and time their figures, and a
node's capacity filled by 64 clients, whose deletions must keep pace with their claims."""


LONGEST = ("tests/e2e/test_api_fuzz.py", "tests/engine/test_determinism.py", "tests/engine/test_images.py",
           "tests/engine/test_bases.py", "tests/rl/test_rl_gateway_agent.py")
"""Modules that take minutes on one worker, longest first. `make test` hands out whole modules to its workers in the
order collected (`--no-loadscope-reorder`): these first, so that the workers start on them rather than end on them,
then the rest with the most tests first (pytest-xdist's own order). The serial set keeps its path order: its
clusters were measured in it."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker; alone (the serial set), modules keep their path order
        sizes = Counter(item.nodeid.split("::")[0] for item in items)
        items.sort(key=lambda item: (_rank(item), -sizes[item.nodeid.split("::")[0]]))  # stable within a module


def _rank(item: pytest.Item) -> int:
    return next((rank for rank, module in enumerate(LONGEST) if item.nodeid.startswith(module)), len(LONGEST))
