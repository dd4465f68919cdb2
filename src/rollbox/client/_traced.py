"""The SDK's side of a trace: a client span per API call, named for the operation, whose context the call's
headers carry to the router (rollbox.tracing)."""

from __future__ import annotations

import contextlib
from typing import Any, TypeVar
from urllib.parse import unquote

from rollbox import tracing
from rollbox.client._call import Call, StreamCall

C = TypeVar("C", Call[Any], StreamCall[Any])
_SANDBOXES = "/v1/sandboxes"
_WHOLE = {"GET": "get", "DELETE": "delete"}
"""Operations on a sandbox itself, by method."""


def traced(call: C) -> contextlib.AbstractContextManager[C]:
    name, attributes = describe(call.method, call.path)
    return tracing.client_call(call, name, attributes)


def describe(method: str, path: str) -> tuple[str, dict[str, str]]:
    """The span's name (`rollbox.claim`, `rollbox.exec`, `rollbox.files`, ...) and attributes for one call."""
    attributes = {"http.request.method": method, "url.path": path}
    if path == _SANDBOXES:
        return ("rollbox.claim" if method == "POST" else "rollbox.list"), attributes
    if not path.startswith(_SANDBOXES + "/"):
        return f"rollbox {method} {path}", attributes
    sandbox_id, _, tail = path[len(_SANDBOXES) + 1:].partition("/")
    attributes["rollbox.sandbox.id"] = unquote(sandbox_id)
    operation = tail.partition("/")[0] or _WHOLE.get(method, method.lower())
    return f"rollbox.{operation}", attributes
