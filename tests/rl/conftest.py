"""The RL tier: each module gets a real embedded server with the example template applied."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servers import rl_server


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with rl_server(tmp_path_factory.mktemp("rl")) as address:
        yield address
