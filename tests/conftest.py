"""What every tier shares. Each tier's own fixtures live in its folder's conftest; helpers in `tests.support`."""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("tests.support", "tests.attacks.attack_support")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
