"""The dashboard of a server without tokens (the README's first example): it opens without asking for one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rollbox.client import SandboxClient
from tests.browser.conftest import WAIT, eventually, live_server
from tests.browser.test_dashboard import rows


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_server(tmp_path_factory.mktemp("open")) as url:
        yield url


def test_an_open_servers_dashboard_asks_for_no_token_and_sends_none(open_server: str, page: Any) -> None:
    sent: list[tuple[str, str | None]] = []
    page.on("request", lambda request: sent.append((request.url, request.headers.get("authorization")))
            if "/dashboard/api/" in request.url else None)
    with SandboxClient(open_server) as client:
        sandbox = client.create_sandbox(template="rl-python", warmpool="rl-python", labels={"run": "readme"})
        sandbox.run("python3 -c 'print(6 * 7)'")
        page.goto(f"{open_server}/dashboard")
        page.wait_for_selector("body[data-updates]", timeout=WAIT * 1000)
        assert page.is_hidden("#sign-in") and page.is_visible("#fleet")
        assert page.is_hidden("#sign-out"), "an open server's page offers to forget a token it never had"
        assert page.evaluate("sessionStorage.getItem('rollbox-token')") is None
        assert page.text_content("#who").startswith("default (admin: every tenant)")
        eventually(lambda: rows(page, "#sandboxes") == [sandbox.id], "the page lists the sandbox")
        page.click(f'#sandboxes tr[data-id="{sandbox.id}"]')
        eventually(lambda: "print(6 * 7)" in (page.text_content("#commands tbody") or ""), "the command log")
        pool = client.get_warmpool("rl-python")
        eventually(lambda: page.text_content('#pools tr[data-name="rl-python"] .ready') == str(pool.target),
                   "the warm pool shown full")
    assert {url.split("/dashboard/api/")[1].split("?")[0] for url, _ in sent} >= {"access", "overview", "stats"}
    assert [url for url, authorization in sent if authorization is not None] == [], "the page sent a token"
