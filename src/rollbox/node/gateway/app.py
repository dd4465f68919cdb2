"""The OpenAI-compatible API a sandbox's agent calls: checked against the sandbox's key and budgets, forwarded to
the claim's upstream, and recorded (`records.py`). Answers, errors included, are shaped as OpenAI's are, so that
an agent's SDK reports them as it would any API error.

The sandbox is the one whose socket the connection came in on (`request.state.sandbox`, set per socket by
`gateway.py`); the key only has to match it. The upstream's own key, if the claim gave one, is added here.
Calls go on with aiohttp's client: it costs the gateway a third of httpx's CPU per call (docs/gateway.md).
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollbox.models import ModelCall
from rollbox.node.gateway.records import StreamRecord, note_answer, tokens_used
from rollbox.node.gateway.session import Session

MAX_BODY = 32 << 20
"""Bytes of a request body: a conversation with long tool outputs fits, a flood does not."""
POSTED = ("chat/completions", "completions", "responses")


def gateway_app(find: Callable[[str], Session | None], client: Callable[[], aiohttp.ClientSession]) -> Starlette:
    def route(endpoint: str, method: str) -> Route:
        """The route of one endpoint: what is forwarded is named by the route, never read off the request's path."""

        async def forward(request: Request) -> Response:
            return await call(request, endpoint)

        return Route(f"/v1/{endpoint}", forward, methods=[method])

    async def call(request: Request, endpoint: str) -> Response:
        session = find(request.state.sandbox)
        if session is None or not session.open:
            return _error(401, "this sandbox's model gateway is closed", "invalid_api_key")
        if not _authorized(request, session.key):
            return _error(401, "wrong API key: use this sandbox's OPENAI_API_KEY", "invalid_api_key")
        payload: dict[str, Any] | None = None
        content: bytes | None = None
        if request.method == "POST":
            content = await _body(request)
            payload = _object(content)
            if payload is None:
                return _error(400, "the body must be a JSON object of at most 32 MiB", "invalid_request_error")
        stream = bool(payload and payload.get("stream"))
        if payload is not None and _amend(payload, session, stream and endpoint == "chat/completions"):
            content = json.dumps(payload).encode()
        record = ModelCall(index=len(session.calls), endpoint=endpoint, stream=stream, started_at=time.time(),
                           request=payload)
        refusal = session.refusal()
        session.calls.append(record)
        if refusal:
            record.status, record.error = 429, refusal
            return _error(429, refusal, "budget_exceeded")
        url = f"{session.config.upstream.rstrip('/')}/{endpoint}"
        try:
            answer = await client().request(request.method, url, data=content, headers=_headers(session),
                                            timeout=_timeout(session))
            if stream and answer.status == 200:
                record.status = 200
                return StreamingResponse(_relay(answer, record, session), status_code=200,
                                         media_type=answer.headers.get("content-type", "text/event-stream"))
            async with answer:
                body = await answer.read()
        except (TimeoutError, aiohttp.ClientError) as error:
            return _failed(record, error)
        record.status = answer.status
        _note(record, body, session)
        return Response(body, status_code=answer.status, media_type=answer.headers.get("content-type"))

    async def unknown(request: Request) -> Response:
        return _error(404, f"{request.method} {request.url.path} is not an endpoint of the model gateway: it "
                           "serves /v1/chat/completions, /v1/completions, /v1/responses and /v1/models", "not_found")

    routes = [*(route(endpoint, "POST") for endpoint in POSTED), route("models", "GET"),
              Route("/{path:path}", unknown, methods=["GET", "POST"])]
    return Starlette(routes=routes)


async def _relay(answer: aiohttp.ClientResponse, record: ModelCall, session: Session) -> AsyncIterator[bytes]:
    """Passes a stream through as it comes, recording it; a budget of seconds spent midway cuts it there."""
    stream = StreamRecord(record)
    limit = session.config.max_seconds
    try:
        async for chunk in answer.content.iter_any():
            stream.feed(chunk)
            yield chunk
            if limit is not None and session.seconds() > limit:
                record.error = f"cut: the episode's budget of {limit:g} seconds ran out during the answer"
                break
    except (TimeoutError, aiohttp.ClientError) as error:
        record.error = f"the upstream's stream failed: {error!r}"
    finally:
        answer.release()
        stream.finish()
        record.duration_ms = (time.time() - record.started_at) * 1000
        session.tokens += tokens_used(record)


def _note(record: ModelCall, body: bytes, session: Session) -> None:
    record.duration_ms = (time.time() - record.started_at) * 1000
    try:
        answer = json.loads(body)
    except ValueError:
        record.error = f"the upstream answered {len(body)} bytes that are not JSON"
        return
    if isinstance(answer, dict):
        note_answer(record, answer)
        session.tokens += tokens_used(record)


def _failed(record: ModelCall, error: Exception) -> Response:
    timed_out = isinstance(error, TimeoutError)
    record.status = 504 if timed_out else 502
    record.error = f"the upstream {'took too long' if timed_out else 'failed'}: {error!r}"
    record.duration_ms = (time.time() - record.started_at) * 1000
    return _error(record.status, record.error, "upstream_error")


async def _body(request: Request) -> bytes | None:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return None
    return body


def _object(body: bytes | None) -> dict[str, Any] | None:
    try:
        payload = json.loads(body) if body is not None else None
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def _amend(payload: dict[str, Any], session: Session, wants_usage: bool) -> bool:
    """Puts in the claim's model, and asks a chat stream to end with its usage (budgets count tokens); whether
    the body changed (else it is forwarded as it came)."""
    changed = False
    if session.config.model and payload.get("model") != session.config.model:
        payload["model"] = session.config.model
        changed = True
    options = payload.get("stream_options")
    if wants_usage and not (isinstance(options, dict) and options.get("include_usage")):
        payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        changed = True
    return changed


def _authorized(request: Request, key: str) -> bool:
    given = request.headers.get("authorization", "").removeprefix("Bearer ").strip() or request.headers.get(
        "api-key", "")
    return hmac.compare_digest(given.encode(), key.encode())


def _headers(session: Session) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if session.config.api_key:
        headers["authorization"] = f"Bearer {session.config.api_key}"
    return headers


def _timeout(session: Session) -> aiohttp.ClientTimeout:
    """The seconds left of the budget, if it has one, bound the whole call."""
    limit = session.config.max_seconds
    left = 600.0 if limit is None else max(limit - session.seconds(), 0.001)
    return aiohttp.ClientTimeout(total=left, connect=min(left, 10.0))


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": code, "code": code, "param": None}},
                        status_code=status)
