"""The end-to-end tier: the SDK and the CLI against a real router, one per module, with `basic` applied."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollbox.client import SandboxClient
from tests.support.servers import ADMINS, TEMPLATE, TOKENS, router


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with router(tmp_path_factory.mktemp("router"), TOKENS, ADMINS) as url:
        yield url


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[SandboxClient]:
    with SandboxClient(url, token="alice-token") as client:
        client.apply(TEMPLATE)
        yield client
