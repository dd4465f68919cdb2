"""The unit tier: no root, no runc, no network. The server runs in-process over `MemoryNode`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from rollbox.server import create_app
from tests.unit.in_process import ADMINS, MAX_BODY, TOKENS, client_of
from tests.unit.memory_node import MemoryNode


@pytest.fixture
def node() -> MemoryNode:
    return MemoryNode()


@pytest.fixture
async def http(node: MemoryNode) -> AsyncIterator[httpx.AsyncClient]:
    """alice's client of the app; other tenants pass their own Authorization header."""
    async with client_of(create_app(node, TOKENS, admins=ADMINS, max_body=MAX_BODY), "alice-token") as client:
        yield client
