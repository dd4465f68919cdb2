"""The dashboard's routes over a real server and sandboxes: tokens, tenants, the admin-only command log and the
page's locks (Content-Security-Policy); tests/unit/test_dashboard_history.py bounds the history behind its charts."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from rollbox.client import SandboxClient
from rollbox.server.dashboard.assets import CONTENT_SECURITY_POLICY
from tests.support.servers import ADMINS, TEMPLATE, TOKENS, router

DATA_ROUTES = ["/dashboard/api/overview", "/dashboard/api/stats?ids=x", "/dashboard/api/sandboxes/x/commands"]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with router(tmp_path_factory.mktemp("dashboard"), TOKENS, ADMINS) as address:
        with SandboxClient(address, TOKENS["alice"]) as admin:
            admin.apply(TEMPLATE)
        yield address


def http(url: str, tenant: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {TOKENS[tenant]}"} if tenant else {}
    return httpx.Client(transport=httpx.HTTPTransport(uds=url.removeprefix("unix://")), base_url="http://rollbox",
                        headers=headers)


@pytest.mark.parametrize("route", DATA_ROUTES)
def test_data_routes_answer_401_without_a_known_token(url: str, route: str) -> None:
    with http(url) as anonymous:
        assert anonymous.get(route).status_code == 401
        assert anonymous.get(route, headers={"Authorization": "Bearer not-a-token"}).status_code == 401
        assert anonymous.get(route + ("&" if "?" in route else "?") + f"token={TOKENS['alice']}").status_code == 401


def test_a_tenant_sees_its_own_sandboxes_and_an_admin_everyones(url: str) -> None:
    with SandboxClient(url, TOKENS["alice"]) as alice, SandboxClient(url, TOKENS["bob"]) as bob, \
            http(url, "alice") as as_alice, http(url, "bob") as as_bob:
        mine = alice.create_sandbox(template="basic")
        theirs = bob.create_sandbox(template="basic", labels={"who": "bob"})
        try:
            seen_by_bob = as_bob.get("/dashboard/api/overview").json()
            assert seen_by_bob["tenant"] == "bob" and not seen_by_bob["admin"]
            assert [s["id"] for s in seen_by_bob["sandboxes"]] == [theirs.id]
            assert seen_by_bob["sandboxes"][0]["labels"] == {"who": "bob"}
            seen_by_alice = as_alice.get("/dashboard/api/overview").json()
            assert seen_by_alice["admin"]
            assert {s["id"]: s["tenant"] for s in seen_by_alice["sandboxes"]} == {mine.id: "alice", theirs.id: "bob"}

            both = f"/dashboard/api/stats?ids={mine.id},{theirs.id}"
            assert set(as_bob.get(both).json()) == {theirs.id}, "a tenant read another's stats"
            figures = as_alice.get(both).json()
            assert set(figures) == {mine.id, theirs.id}
            assert figures[mine.id]["memory_bytes"] > 0 and figures[mine.id]["cpu_seconds"] >= 0
            many = ",".join(f"sb-{n}" for n in range(101))
            assert as_alice.get(f"/dashboard/api/stats?ids={many}").status_code == 400
        finally:
            mine.delete()
            theirs.delete()


def test_the_command_log_is_for_admins_and_goes_with_its_sandbox(url: str) -> None:
    with SandboxClient(url, TOKENS["bob"]) as bob, http(url, "alice") as as_alice, http(url, "bob") as as_bob:
        sandbox = bob.create_sandbox(template="basic")
        route = f"/dashboard/api/sandboxes/{sandbox.id}/commands"
        try:
            sandbox.run("echo secret-work")
            sandbox.run(["sh", "-c", "exit 3"])
            assert as_bob.get(route).status_code == 403, "a tenant read the command log"
            log = as_alice.get(route).json()
            assert [(entry["command"], entry["exit_code"], entry["tenant"]) for entry in log] == [
                ("echo secret-work", 0, "bob"), ("sh -c exit 3", 3, "bob")]
            assert all(entry["duration_ms"] > 0 for entry in log)
        finally:
            sandbox.delete()
        assert as_alice.get(route).json() == [], "the command log outlived its sandbox"


def test_the_page_and_its_files_carry_a_strict_content_security_policy(url: str) -> None:
    with http(url) as anonymous:
        for path in ("/dashboard", "/dashboard/static/js/dashboard.js", "/dashboard/static/css/rollbox.css"):
            answer = anonymous.get(path)
            assert answer.status_code == 200, path
            assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert answer.headers["x-content-type-options"] == "nosniff"
        assert "unsafe-inline" not in CONTENT_SECURITY_POLICY and "http" not in CONTENT_SECURITY_POLICY
        page = anonymous.get("/dashboard").text
        assert "<script>" not in page and "style=" not in page and "on" + "click" not in page
        for path in ("js/..%2Froutes.py", "js/../__init__.py", "js/nope.js", "js/%2Fetc%2Fpasswd", "js/rollbox.css",
                     "css/dashboard.html", "js/dashboard.html"):
            assert anonymous.get(f"/dashboard/static/{path}").status_code == 404, path

