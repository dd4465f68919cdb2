"""Routes, each described once for both dispatch and the OpenAPI document, and the ASGI app that dispatches them.

FastAPI, and Starlette's own stack (middleware and exception layers, a Request object each, a linear
route scan), cost a large share of the server's own time on the claim and exec paths
(docs/design-notes.md), so the little they did for us is done here: the route from the method and path, the tenant
from the bearer token, query parameters, a pydantic body, and an error answer for whatever a
handler raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.convertors import StringConvertor
from starlette.datastructures import URL, QueryParams
from starlette.requests import ClientDisconnect, Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from rollbox._problems import problems
from rollbox.errors import InvalidRequest, MethodNotAllowed, NotFound, UnprocessableBody
from rollbox.server.auth import ClusterSecret, Tenants
from rollbox.server.tracing import traced_endpoint

Handler = Callable[..., Awaitable[Response]]
Endpoint = Callable[[Scope, Receive, dict[str, Any]], Awaitable[Response]]
"""A route's parsing around its handler: (scope, receive, path parameters) to the response."""
Methods = dict[str, Endpoint]
REQUIRED: Any = object()


@dataclass
class Query:
    """One query parameter, handed to the handler as a keyword argument of its name."""

    name: str
    type: type = str
    default: Any = REQUIRED

    def read(self, params: QueryParams) -> Any:
        raw = params.get(self.name)
        if raw is None:
            if self.default is REQUIRED:
                raise UnprocessableBody(f"invalid request: query parameter {self.name!r} is required")
            return self.default
        if self.type is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise UnprocessableBody(f"invalid request: {self.name}={raw!r}: use true or false")
            return raw.lower() in ("true", "1")
        try:
            return self.type(raw)
        except ValueError:
            raise UnprocessableBody(f"invalid request: {self.name}={raw!r} is not a {self.type.__name__}") from None


@dataclass
class RouteSpec:
    method: str
    path: str
    handler: Handler
    body: type[BaseModel] | type[bytes] | None = None
    """A pydantic model (JSON), `bytes` (the raw body) or None."""
    answer: Any = None
    """What a success returns: a model, `list[Model]`, a media type string, or None (no content)."""
    status: int = 200
    query: list[Query] = field(default_factory=list)
    auth: bool = True
    admin: bool = False
    """Only the server's admins may call it (see auth.Tenants)."""
    request: bool = False
    """The handler takes the Starlette `request` too: to ask whether its caller is still there
    (`request.is_disconnected()`)."""


class Routes:
    """Collects route specs; `app()` turns them into the ASGI app that parses what each spec declares."""

    def __init__(self, tenants: Tenants | ClusterSecret) -> None:
        self.tenants = tenants
        self.specs: list[RouteSpec] = []

    def add(self, method: str, path: str, *, body: type[BaseModel] | type[bytes] | None = None, answer: Any = None,
            status: int = 200, query: tuple[Query, ...] = (), auth: bool = True, admin: bool = False,
            request: bool = False) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.specs.append(RouteSpec(method, path, handler, body, answer, status, list(query), auth, admin,
                                        request))
            return handler
        return register

    def app(self, fail: Callable[[Exception], Response], startup: Callable[[], None] = lambda: None) -> Router:
        """The ASGI app; `fail` turns whatever a request raised into its answer, `startup` runs as the server starts."""
        routes = [(spec.method, spec.path, traced_endpoint(spec.method, spec.path, spec.handler.__name__,
                                                           self._endpoint(spec))) for spec in self.specs]
        return Router(routes, fail, startup)

    def _endpoint(self, spec: RouteSpec) -> Endpoint:
        tenants, handler, body, query, auth, admin, request = (self.tenants, spec.handler, spec.body, spec.query,
                                                               spec.auth, spec.admin, spec.request)
        model = body if isinstance(body, type) and issubclass(body, BaseModel) else None

        async def endpoint(scope: Scope, receive: Receive, args: dict[str, Any]) -> Response:
            if auth:
                args["tenant"] = tenant = tenants.tenant(header(scope, b"authorization"),
                                                         header(scope, b"x-rollbox-tenant"))
                if admin:
                    tenants.require_admin(tenant)
            if query:
                params = QueryParams(scope["query_string"])
                for param in query:
                    args[param.name] = param.read(params)
            if model is not None:
                args["body"] = parse(model, await read_body(receive))
            elif body is bytes:
                args["body"] = await read_body(receive)
            if request:
                args["request"] = Request(scope, receive)
            return await handler(**args)

        return endpoint


class Router:
    """Finds a request's endpoint by path (an exact one first, then patterns in order) and method.

    Paths and their parameters match as Starlette's did (`{name}` is one non-empty segment, HEAD
    goes where GET does, a path off by a trailing slash redirects), so the API did not change.
    """

    def __init__(self, routes: list[tuple[str, str, Endpoint]], fail: Callable[[Exception], Response],
                 startup: Callable[[], None]) -> None:
        self._fail = fail
        self._startup = startup
        self._exact: dict[str, Methods] = {}
        self._patterns: dict[str, tuple[re.Pattern[str], Methods]] = {}
        for method, path, endpoint in routes:
            regex, _, convertors = compile_path(path)
            if not convertors:
                methods = self._exact.setdefault(path, {})
            else:
                if not all(isinstance(c, StringConvertor) for c in convertors.values()):
                    raise ValueError(f"{path}: only plain {{name}} parameters are supported")
                methods = self._patterns.setdefault(path, (regex, {}))[1]
            methods[method] = endpoint
            if method == "GET":
                methods.setdefault("HEAD", endpoint)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            try:
                endpoint, args = self._route(scope)
                response = await endpoint(scope, receive, args)
            except Exception as error:
                response = self._fail(error)
            await response(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await send({"type": "websocket.close", "code": 1000, "reason": ""})

    def _route(self, scope: Scope) -> tuple[Endpoint, dict[str, Any]]:
        found = self._find(scope["path"])
        if found is None:
            return self._redirect, {}
        methods, args = found
        endpoint = methods.get(scope["method"])
        if endpoint is None:
            raise MethodNotAllowed("Method Not Allowed")
        return endpoint, args

    def _find(self, path: str) -> tuple[Methods, dict[str, Any]] | None:
        methods = self._exact.get(path)
        if methods is not None:
            return methods, {}
        for regex, methods in self._patterns.values():
            match = regex.match(path)
            if match is not None:
                return methods, match.groupdict()
        return None

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Runs `startup`; nothing to stop: the node is made before the app and closed after the server."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _redirect(self, scope: Scope, receive: Receive, args: dict[str, Any]) -> Response:
        """No route: a 307 to the same path with its trailing slash added or removed, when that is a route."""
        path = scope["path"]
        other = path.rstrip("/") if path.endswith("/") else path + "/"
        if path == "/" or self._find(other) is None:
            raise NotFound("no such route: see docs/api.md or /openapi.json")
        return RedirectResponse(url=str(URL(scope={**scope, "path": other})))


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (the first, if sent twice)."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(receive: Receive) -> bytes:
    """The whole request body (ClientDisconnect if the client hung up before sending it)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def json_object(raw: bytes) -> dict[str, Any]:
    """A body that must be a JSON object, for the facades that read other APIs' shapes without a model."""
    try:
        value = json.loads(raw)
    except ValueError as error:
        raise InvalidRequest(f"the body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("the body must be a JSON object")
    return value


def parse(model: type[BaseModel], raw: bytes) -> Any:
    try:
        return model.__pydantic_validator__.validate_json(raw)  # model_validate_json without its Python wrapper
    except ValidationError as error:
        raise UnprocessableBody(f"invalid request: {problems(error, 'body')}") from None


