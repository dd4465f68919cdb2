"""SecretPath, the capability URL in front of gateways whose clients send no token, attacked through a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollbox.errors import InvalidRequest
from rollbox.server.capability import MIN_KEY_LENGTH, SecretPath, new_key
from rollbox.server.threaded import ThreadServer

KEY = new_key()


@pytest.fixture(scope="module")
def reached() -> list[dict[str, Any]]:
    return []


@pytest.fixture(scope="module")
def origin(reached: list[dict[str, Any]]) -> Iterator[str]:
    """A loopback port serving, under KEY, an app that records every request that reaches it."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append({"path": scope["path"], "root_path": scope["root_path"]})
        body = json.dumps(reached[-1]).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    with ThreadServer(SecretPath(app, KEY), tcp=True) as server:
        yield server.url


@pytest.mark.parametrize("path", ["/", "/v1/ping", f"/{KEY[:-1]}/v1/ping", f"/{KEY}x/v1/ping", f"/x{KEY}/v1/ping",
                                  f"/{KEY[:MIN_KEY_LENGTH]}/v1/ping", f"/v1/{KEY}/ping", f"//{KEY}/v1/ping",
                                  f"/{KEY.swapcase()}/v1/ping", f"/%2F{KEY}/v1/ping"],
                         ids=["root", "no key", "key cut short", "key and more", "more and key", "key's start",
                              "key inside", "empty segment", "key's case swapped", "encoded slash"])
def test_a_path_without_the_key_never_reaches_the_app(origin: str, reached: list[dict[str, Any]], path: str) -> None:
    before = len(reached)
    for method in ("GET", "POST", "PUT", "DELETE"):
        answer = httpx.request(method, origin + path, content=b"{}")
        assert answer.status_code == 404 and KEY not in answer.text, (method, answer.text)
    assert len(reached) == before


def test_the_key_reaches_the_app_mounted_under_it(origin: str) -> None:
    answer = httpx.get(f"{origin}/{KEY}/v1/ping?x=1")
    assert answer.status_code == 200
    assert answer.json() == {"path": f"/{KEY}/v1/ping", "root_path": f"/{KEY}"}


@pytest.mark.parametrize("key", ["", "short", "a" * (MIN_KEY_LENGTH - 1), "a" * 20 + "/b", "a" * 20 + " b",
                                 "é" * 20, "a" * 20 + "%2F"])
def test_a_weak_or_unsafe_key_is_refused(key: str) -> None:
    with pytest.raises(InvalidRequest, match=f"at least {MIN_KEY_LENGTH} characters"):
        SecretPath(lambda *_: None, key)  # type: ignore[arg-type]


def test_new_keys_are_long_and_differ() -> None:
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100 and all(len(key) == 32 for key in keys)
