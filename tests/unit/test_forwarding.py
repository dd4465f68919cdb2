"""Which calls a router forwards as bytes (cluster/forwarding.py): the exact paths of the table, and nothing that
merely starts or ends like one."""

from __future__ import annotations

import pytest

from rollbox.cluster.forwarding import FORWARDED, _forwarded, _wait


@pytest.mark.parametrize(("method", "path", "call"), [
    ("POST", "/v1/sandboxes/alpha-1f/exec", ("POST", "exec")),
    ("GET", "/v1/sandboxes/alpha-1f/files", ("GET", "files")),
    ("PUT", "/v1/sandboxes/alpha-1f/files", ("PUT", "files")),
    ("POST", "/v1/sandboxes/alpha-1f/exec/stream", None),  # a stream: the API's route passes it through
    ("GET", "/v1/sandboxes/alpha-1f/files/list", None),
    ("HEAD", "/v1/sandboxes/alpha-1f/files", None),
    ("GET", "/v1/sandboxes/alpha-1f/exec", None),
    ("POST", "/v1/sandboxes//exec", None),
    ("POST", "/v1/sandboxes/alpha-1f/exec/", None),
    ("POST", "/v1/sandboxes/a/b/exec", None),
    ("POST", "/v2/sandboxes/alpha-1f/exec", None),
    ("POST", "/v1/sandboxes", None),
])
def test_only_the_tables_calls_are_forwarded(method: str, path: str, call: tuple[str, str] | None) -> None:
    found = _forwarded(method, path)
    assert (None if found is None else (found[0], found[1])) == (
        None if call is None else ("alpha-1f", FORWARDED[call]))


@pytest.mark.parametrize(("body", "wait"), [
    (b'{"command": "true", "timeout": 5}', 5.0),
    (b'{"command": "true", "timeout": 0.25}', 0.25),
    (b'{"command": "true"}', None),
    (b'{"command": "true", "timeout": null}', None),
    (b'{"command": "true", "timeout": true}', None),
    (b'{"command": "true", "timeout": "5"}', None),
    (b'["true"]', 0.0),
    (b"{not json", 0.0),
])
def test_a_command_is_waited_for_as_long_as_its_own_timeout(body: bytes, wait: float | None) -> None:
    assert _wait(body) == wait
