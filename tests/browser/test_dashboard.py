"""The dashboard in Chromium against a live server: the page shows what the API says, to whom it may say it,
and shows every name, label and command as text."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rollbox.client import SandboxClient
from tests.browser.conftest import api, eventually, sign_in
from tests.support.servers import TOKENS

ALICE, BOB = TOKENS["alice"], TOKENS["bob"]
ATTACK_LABEL = '<img src=x onerror="window.__pwned=1">'
ATTACK_COMMAND = "echo '<script>window.__pwned=2</script><b>bold</b>'"


def rows(page: Any, table: str) -> list[str]:
    return page.eval_on_selector_all(f"{table} tbody tr", "rows => rows.map(row => row.dataset.id || row.dataset.name)")


def cells(page: Any, table: str, cell: str) -> dict[str, str]:
    return page.eval_on_selector_all(
        f"{table} tbody tr",
        f"rows => Object.fromEntries(rows.map(row => [row.dataset.id || row.dataset.name, row.querySelector('{cell}')"
        ".textContent]))")


def steady_pools(url: str) -> list[dict[str, Any]]:
    pools = api(url, ALICE, "/v1/warmpools")
    return pools if all(p["ready"] == p["target"] and not p["starting"] for p in pools) else []


def test_the_admins_page_shows_the_apis_numbers_for_every_tenant(server: str, page: Any) -> None:
    eventually(lambda: steady_pools(server), "the warm pool is full")
    with SandboxClient(server, ALICE) as alice, SandboxClient(server, BOB) as bob:
        mine = alice.create_sandbox(template="rl-python", labels={"team": "admins"})
        theirs = bob.create_sandbox(template="rl-python")
        try:
            mine.run("echo from-the-admin && head -c 20000000 /dev/zero > /tmp/fill")
            sign_in(page, server, ALICE)
            assert page.text_content("#who").startswith("alice (admin")

            def agrees() -> bool:
                health = httpx.get(f"{server}/healthz").json()
                listed = {s["id"] for s in api(server, ALICE, "/v1/sandboxes")} | {
                    s["id"] for s in api(server, BOB, "/v1/sandboxes")}
                return (page.text_content("#node-sandboxes") == str(health["sandboxes"])
                        and page.text_content("#node-claims") == str(health["claims"])
                        and page.text_content("#node-max") == str(health["max_sandboxes"])
                        and set(rows(page, "#sandboxes")) == listed == {mine.id, theirs.id}
                        and page.text_content("#sandbox-count") == "2")
            eventually(agrees, "the page's node and sandbox figures match the API's")
            assert cells(page, "#sandboxes", ".tenant") == {mine.id: "alice", theirs.id: "bob"}
            assert cells(page, "#sandboxes", ".labels")[mine.id] == "team=admins"
            assert cells(page, "#sandboxes", ".template")[mine.id] == "rl-python"

            def pools_agree() -> bool:  # the pool refills after the claims: compare once it is steady
                pools = {p["name"]: p for p in steady_pools(server)}
                return bool(pools) and set(rows(page, "#pools")) == set(pools) and all(
                    cells(page, "#pools", f".{column}") == {n: str(p[column]) for n, p in pools.items()}
                    for column in ("ready", "target", "starting"))
            eventually(pools_agree, "the page's warm pools match the API's")

            def memory_agrees() -> bool:
                shown = page.get_attribute(f'#sandboxes tr[data-id="{mine.id}"] td.memory', "data-bytes")
                return shown is not None and abs(int(shown) - mine.stats().memory_bytes) <= 2 * 2**20
            eventually(memory_agrees, "the page's memory figure is the API's, within 2 MiB")
            cpu = page.get_attribute(f'#sandboxes tr[data-id="{mine.id}"] td.cpu', "data-seconds")
            assert 0 < float(cpu) <= mine.stats().cpu_seconds

            eventually(lambda: int(page.get_attribute("#chart-exec", "data-calls") or 0) >= 1, "the exec chart")
            assert int(page.get_attribute("#chart-claim", "data-calls")) >= 2
            assert page.locator("#chart-claim polyline[data-series=p99]").count() == 1

            page.click(f'#sandboxes tr[data-id="{mine.id}"]')
            eventually(lambda: "from-the-admin" in (page.text_content("#commands tbody") or ""),
                       "the command log shows the sandbox's command")
            assert page.text_content("#commands-sandbox") == mine.id
        finally:
            mine.delete()
            theirs.delete()


@pytest.mark.console_errors("403 (Forbidden)")
def test_a_tenants_page_shows_only_its_own_sandboxes_and_no_command_log(server: str, page: Any) -> None:
    with SandboxClient(server, ALICE) as alice, SandboxClient(server, BOB) as bob:
        hidden = alice.create_sandbox(template="rl-python", labels={"secret": "alice-only"})
        own = bob.create_sandbox(template="rl-python")
        try:
            own.run("echo bobs-command")
            sign_in(page, server, BOB)
            eventually(lambda: rows(page, "#sandboxes") == [own.id], "bob's page lists his sandbox alone")
            assert page.text_content("#who") == "bob"
            assert hidden.id not in page.content() and "alice-only" not in page.content()
            page.click(f'#sandboxes tr[data-id="{own.id}"]')
            assert page.is_hidden("#commands-section")
            fetch = """async ([path]) => (await fetch(path, {headers: {Authorization:
                'Bearer ' + sessionStorage.getItem('rollbox-token')}})).status"""
            assert page.evaluate(fetch, [f"/dashboard/api/sandboxes/{own.id}/commands"]) == 403
            stats = page.evaluate("""async ([path]) => (await fetch(path, {headers: {Authorization:
                'Bearer ' + sessionStorage.getItem('rollbox-token')}})).json()""",
                                  [f"/dashboard/api/stats?ids={hidden.id},{own.id}"])
            assert list(stats) == [own.id]
            assert page.evaluate("location.href") == f"{server}/dashboard", "the token went into the URL"
        finally:
            hidden.delete()
            own.delete()


@pytest.mark.console_errors("401 (Unauthorized)")
def test_a_wrong_token_is_refused_and_the_page_asks_again(server: str, page: Any) -> None:
    page.goto(f"{server}/dashboard")
    page.wait_for_selector("#sign-in:not([hidden])")
    page.fill("#token", "not-a-token")
    page.click("#sign-in-button")
    eventually(lambda: "not known" in (page.text_content("#sign-in-error") or ""), "the page says the token is unknown")
    assert page.is_hidden("#fleet")
    assert page.evaluate("sessionStorage.getItem('rollbox-token')") is None


@pytest.mark.console_errors("Content Security Policy")
def test_markup_in_labels_and_commands_shows_as_text(server: str, page: Any) -> None:
    with SandboxClient(server, ALICE) as alice:
        sandbox = alice.create_sandbox(template="rl-python", labels={"note": ATTACK_LABEL})
        try:
            sandbox.run(ATTACK_COMMAND)
            sign_in(page, server, ALICE)
            eventually(lambda: cells(page, "#sandboxes", ".labels").get(sandbox.id) == f"note={ATTACK_LABEL}",
                       "the label shows as its characters")
            page.click(f'#sandboxes tr[data-id="{sandbox.id}"]')
            eventually(lambda: ATTACK_COMMAND in (page.text_content("#commands tbody") or ""),
                       "the command shows as its characters")
            assert page.locator("#sandboxes img, #commands script, #commands b").count() == 0
            assert page.evaluate("window.__pwned") is None, "markup from a label or command ran"
            inline = """() => { const script = document.createElement('script');
                script.textContent = 'window.__inline = 1'; document.body.append(script); return window.__inline; }"""
            assert page.evaluate(inline) is None, "the Content-Security-Policy let an inline script run"
        finally:
            sandbox.delete()
