"""The OpenAPI document, built from the same route specs the server dispatches on."""

from __future__ import annotations

import re
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from rollbox.models import ErrorBody
from rollbox.server.routing import REQUIRED, RouteSpec

_TYPES = {str: "string", int: "integer", bool: "boolean", float: "number"}
_FAILURES = {
    400: "invalid_request: a value the server cannot use (the message says which and why)",
    401: "unauthorized: no token, or one the server does not know",
    403: "forbidden: only the server's admins may do this",
    404: "not found: no such sandbox, template, warm pool, snapshot or file",
    409: "conflict: the sandbox is paused or stopped, or the resource is in use or exists already",
    413: "too_large: the body is over the server's limit",
    422: "invalid_request: malformed JSON, or a missing or mistyped field or query parameter",
    429: "capacity_exceeded: no room for another sandbox on the node or in the tenant's quota",
}
"""What a client can get wrong, by status; a 5xx is the server's own failure and never documented."""


def document(specs: list[RouteSpec], title: str, version: str, description: str) -> dict[str, Any]:
    models = sorted({ErrorBody, *(model for spec in specs for model in _models(spec))}, key=lambda m: m.__name__)
    _, schemas = models_json_schema([(model, "validation") for model in models],
                                    ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, Any]] = {}
    for spec in specs:
        paths.setdefault(spec.path, {})[spec.method.lower()] = _operation(spec)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
        "components": {"schemas": schemas.get("$defs", {}),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _operation(spec: RouteSpec) -> dict[str, Any]:
    summary = (spec.handler.__doc__ or spec.handler.__name__).strip().splitlines()[0]
    if spec.admin:
        summary += " Needs an admin's token."
    parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"{(\w+)}", spec.path)]
    parameters += [{"name": q.name, "in": "query", "required": q.default is REQUIRED,
                    "schema": {"type": _TYPES[q.type]} | ({} if q.default is REQUIRED else {"default": q.default})}
                   for q in spec.query]
    responses = {str(spec.status): _answer(spec.answer)}
    responses.update((str(status), {"description": _FAILURES[status], "content": {
        "application/json": {"schema": _ref(ErrorBody)}}}) for status in _failures(spec))
    operation: dict[str, Any] = {"operationId": spec.handler.__name__, "summary": summary, "responses": responses}
    if parameters:
        operation["parameters"] = parameters
    if spec.body is bytes:
        operation["requestBody"] = {"required": True, "content": {"application/octet-stream": {
            "schema": {"type": "string", "format": "binary"}}}}
    elif spec.body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(spec.body)}}}
    if spec.auth:
        operation["security"] = [{"bearer": []}]
    return operation


def _failures(spec: RouteSpec) -> list[int]:
    """The error statuses an operation can answer, from what it takes."""
    named = "{" in spec.path or spec.body is not None or spec.method == "DELETE"  # by name: a DELETE's may be a query
    makes = spec.method == "POST" and spec.path.startswith("/v1/sandboxes")  # may start a sandbox
    creates = spec.method == "POST" and spec.status == 201  # what it makes may exist already, or its volume be in use
    flags = {400: True, 401: spec.auth, 403: spec.admin, 404: named, 409: "{" in spec.path or creates,
             413: spec.body is not None, 422: spec.body is not None or bool(spec.query), 429: makes}
    return [status for status, applies in flags.items() if applies]


def _answer(answer: Any) -> dict[str, Any]:
    if answer is None:
        return {"description": "done, no content"}
    if isinstance(answer, str):
        return {"description": f"{answer} content", "content": {answer: {}}}
    return {"description": "success", "content": {"application/json": {"schema": _schema(answer)}}}


def _schema(answer: Any) -> dict[str, Any]:
    if typing.get_origin(answer) is list:
        return {"type": "array", "items": _ref(typing.get_args(answer)[0])}
    return _ref(answer)


def _ref(model: type) -> dict[str, Any]:
    return _ref_named(model.__name__)


def _ref_named(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _models(spec: RouteSpec) -> list[type[BaseModel]]:
    found = [spec.body, spec.answer, *typing.get_args(spec.answer)]
    return [m for m in found if isinstance(m, type) and issubclass(m, BaseModel)]
