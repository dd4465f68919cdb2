"""The browser tier: Debian's Chromium, driven by Playwright, against a live server over real sandboxes.

One server serves the whole tier, on a loopback port (a browser speaks TCP) with two tenants' tokens, `alice`
its admin. Each test's page is photographed as it ends, under test-artifacts/browser/ (git-ignored), pass or
fail, so that CI keeps what the page looked like.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox.client import SandboxClient
from rollbox.node import LocalNode
from rollbox.server import create_app
from rollbox.server.threaded import ThreadServer
from tests.support.engines import make_engine, teardown_engine
from tests.support.servers import ADMINS, RL_TEMPLATE, TOKENS

playwright_api = pytest.importorskip("playwright.sync_api", reason="the browser tier needs the 'browser' extra")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
"""No sandbox: the tests run as root, which Chromium's own sandbox refuses. Nothing that calls out: the machine's
network is closed, and a test must not wait on a call that cannot answer."""
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
WAIT = 15.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "console_errors(*texts): console errors the test expects (else they fail it)")


@contextlib.contextmanager
def live_server(root: Path, tokens: dict[str, str] | None = None, admins: tuple[str, ...] = ()) -> Iterator[str]:
    """A real server on a loopback port, with the RL example's template and warm pool applied by its first admin
    (on an open server, by anyone)."""
    engine = make_engine(root)
    node = LocalNode(engine, max_sandboxes=24)
    try:
        with ThreadServer(create_app(node, tokens, admins=admins), tcp=True) as served:
            with SandboxClient(served.url, tokens[admins[0]] if tokens else None) as admin:
                admin.apply(str(RL_TEMPLATE))
            yield served.url
    finally:
        node.close()
        teardown_engine(engine)


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tier's server: two tenants' tokens, `alice` its admin."""
    with live_server(tmp_path_factory.mktemp("browser"), TOKENS, ADMINS) as url:
        yield url


@pytest.fixture(scope="package")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Chromium with a new, empty profile; each test opens its own tab (sessionStorage is per tab). Closed with the
    tier: while Playwright's sync API is open its event loop runs in this thread, and later tiers run their own."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup.sh installs Debian's chromium")
    with playwright_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A new tab; its console errors fail the test, and its screenshot is kept."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    try:
        yield tab
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w-]+", "_", request.node.name)
        with contextlib.suppress(Exception):
            tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        tab.close()
    marker = request.node.get_closest_marker("console_errors")
    allowed = marker.args if marker else ()
    unexpected = [error for error in errors if not any(pattern in error for pattern in allowed)]
    assert not unexpected, f"the page logged errors: {unexpected}"


def sign_in(page: Any, url: str, token: str) -> None:
    """Opens the dashboard and types `token` into it, as a person does; waits for its first update."""
    page.goto(f"{url}/dashboard")
    page.fill("#token", token)
    page.click("#sign-in-button")
    page.wait_for_selector("body[data-updates]", timeout=WAIT * 1000)


def api(url: str, token: str, path: str) -> Any:
    answer = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {token}"})
    answer.raise_for_status()
    return answer.json()


def eventually(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Retries `check` until it returns something true: the page and the API are read at different moments, so
    they agree once the page has updated after the last change."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: still not so after {timeout:.0f}s (last: {result!r})"
        time.sleep(0.2)
