"""agent-sandbox's port routing against a real `rollbox serve`: requests with the router's headers and another
`X-Sandbox-Port` (or a path the runtime API has not) reach the sandbox's own server, as agent-sandbox's router
passes them to the pod (docs/ports.md)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import websocket
from k8s_agent_sandbox import SandboxClient

from tests.compat.test_agent_sandbox import TOKENS, Router, pooled_router
from tests.support.cluster import wait_for
from tests.support.port_server import PORT_SERVER


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with pooled_router(tmp_path_factory.mktemp("agent-sandbox-ports")) as server:
        yield server


@pytest.fixture(scope="module")
def alice(router: Router) -> Iterator[SandboxClient]:
    client = router.client("alice")
    yield client
    client.delete_all()


def headers(sandbox_id: str, port: int | None, tenant: str = "alice") -> dict[str, str]:
    sent = {"Authorization": f"Bearer {TOKENS[tenant]}", "X-Sandbox-ID": sandbox_id,
            "X-Sandbox-Namespace": "default"}
    return sent if port is None else {**sent, "X-Sandbox-Port": str(port)}


def test_the_port_header_reaches_the_sandboxs_server(router: Router, alice: SandboxClient) -> None:
    sandbox = alice.create_sandbox(warmpool="python-pool")
    sandbox.files.write("port_server.py", PORT_SERVER)
    sandbox.commands.run("nohup python3 port_server.py 8000 >/dev/null 2>&1 &", timeout=10)
    to_8000 = headers(sandbox.sandbox_id, 8000)

    def up() -> bool:
        try:
            return httpx.get(f"{router.url}/hello", headers=to_8000).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, "the sandbox's server listens")
    seen = httpx.get(f"{router.url}/headers?q=1", headers={**to_8000, "X-Sandbox-Timeout": "5"}).json()
    assert seen["target"] == "/headers?q=1"
    assert not [name for name in seen["headers"] if name.startswith("x-sandbox-") or name == "authorization"]
    assert httpx.post(f"{router.url}/echo", content=b"body", headers=to_8000).content == b"body"
    assert sandbox.commands.run("echo runtime API").stdout == "runtime API\n"  # port 8888: rollbox's own
    connection = websocket.create_connection(router.url.replace("http", "ws") + "/ws", timeout=10,
                                             header=[f"{key}: {value}" for key, value in to_8000.items()])
    connection.send("through the port header")
    assert connection.recv() == "through the port header"
    connection.close()
    nothing = httpx.get(f"{router.url}/hello", headers=headers(sandbox.sandbox_id, 8001))
    assert nothing.status_code == 502 and "nothing listens on port 8001" in nothing.json()["detail"]
    not_bobs = httpx.get(f"{router.url}/hello", headers=headers(sandbox.sandbox_id, 8000, "bob"))
    assert not_bobs.status_code == 404
    anonymous = {key: value for key, value in to_8000.items() if key != "Authorization"}
    assert httpx.get(f"{router.url}/hello", headers=anonymous).status_code == 401
    elsewhere = httpx.get(f"{router.url}/hello", headers={**to_8000, "X-Sandbox-Namespace": "elsewhere"})
    assert elsewhere.status_code == 404
    alice.delete_sandbox(sandbox.claim_name)
