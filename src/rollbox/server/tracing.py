"""The router's and node's side of a trace (rollbox.tracing): a server span per request, the child of the caller's
span by its `traceparent` header. On a node, the engine adds how a command's time split (queueing, agent,
command) to it; on a cluster's router, the node agent's span is its child. Installed only when tracing is on, so a
server without it runs exactly the code it ran before."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import Response, StreamingResponse

from rollbox import tracing

E = TypeVar("E", bound=Callable[[Any, Any, dict[str, Any]], Awaitable[Response]])
"""A route's endpoint: (scope, receive, path parameters) to the response (`rollbox.server.routing.Endpoint`)."""


def traced_endpoint(method: str, path: str, operation: str, endpoint: E) -> E:
    """`endpoint` inside a server span named after its route, when tracing is on; `operation` names its handler."""
    if not tracing.on:
        return endpoint
    name = f"{method} {path}"
    route = {"http.request.method": method, "http.route": path, "rollbox.operation": operation}

    async def traced(scope: Any, receive: Any, args: dict[str, Any]) -> Any:
        attributes = {**route, "rollbox.sandbox.id": args["sandbox_id"]} if "sandbox_id" in args else route
        try:
            with tracing.server_span(name, scope["headers"], attributes) as span:
                response = await endpoint(scope, receive, args)
        except BaseException:
            span.end()
            raise
        span.set_attribute("http.response.status_code", response.status_code)
        if isinstance(response, StreamingResponse):  # the work goes on while the answer streams
            response.body_iterator = _ending(response.body_iterator, span)
        else:
            span.end()
        return response

    return traced  # type: ignore[return-value]


async def _ending(body: AsyncIterable[Any], span: Any) -> AsyncIterator[Any]:
    try:
        async for chunk in body:
            yield chunk
    finally:
        span.end()
