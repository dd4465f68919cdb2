"""The Connect protocol over ASGI: unary and server-streaming calls, in JSON or binary protobuf.

A unary call is a POST whose body is the message (`application/json` or `application/proto`); it answers
the message, or an error as `{"code", "message"}` with the code's HTTP status. A streaming call
(`application/connect+json` or `+proto`) frames each message in an envelope (a flags byte and a 4-byte
big-endian length): a server-streaming call sends one and answers 200 with a stream of them, a
client-streaming call sends a stream of them and answers one; either answer is closed by an end-of-stream
envelope (flag 0x02) whose JSON carries the error if the call failed. Compression is not offered, so
clients send none.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

ENVELOPE = struct.Struct(">BI")
MAX_MESSAGE = 16 * 2**20
"""The largest message a client stream may carry."""
COMPRESSED, END_STREAM = 0x01, 0x02
STATUS = {"canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504, "not_found": 404,
          "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429, "failed_precondition": 400,
          "aborted": 409, "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
          "data_loss": 500, "unauthenticated": 401}


class RpcError(Exception):
    """Ends a call with a Connect error code (a key of STATUS) and a message for the caller."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": str(self)}


@dataclass
class Call:
    """What a handler knows of its call besides the message: the HTTP request and the caller's deadline."""

    request: Request
    deadline: float | None
    """time.monotonic() by which the caller stops waiting (Connect-Timeout-Ms), or None."""
    context: Any = None
    """What the service's guard found out about the caller (the sandbox and tenant, say)."""

    def timeout(self) -> float | None:
        return None if self.deadline is None else max(0.001, self.deadline - time.monotonic())


Unary = Callable[[Call, Any], Awaitable[Message]]
"""Also a client stream's handler, which gets an async iterator of the messages instead of one."""
ServerStream = Callable[[Call, Any], AsyncIterator[Message]]
Guard = Callable[[Request], Awaitable[Any]]
"""Runs before a call's body is read: answers what `Call.context` holds, or raises to refuse the call."""
Translate = Callable[[Exception], RpcError]
"""Turns whatever else a call raised into the error its caller gets."""


@dataclass
class Method:
    request: type[Message]
    handler: Unary | ServerStream
    streaming: bool = False
    """The server streams its answer."""
    client_streaming: bool = False
    """The client streams its request."""


class Codec:
    """One of Connect's two encodings of a message."""

    def __init__(self, binary: bool) -> None:
        self.binary = binary

    def decode(self, raw: bytes, kind: type[Message]) -> Message:
        message = kind()
        try:
            if self.binary:
                message.ParseFromString(raw)
            else:
                json_format.Parse(raw or b"{}", message, ignore_unknown_fields=True)
        except (DecodeError, json_format.ParseError, UnicodeDecodeError) as error:
            raise RpcError("invalid_argument", f"the request is not a valid {kind.DESCRIPTOR.full_name}: "
                                               f"{error}") from None
        return message

    def encode(self, message: Message) -> bytes:
        if self.binary:
            return message.SerializeToString()
        return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()


JSON, PROTO = Codec(binary=False), Codec(binary=True)
UNARY_TYPES = {"application/json": JSON, "application/proto": PROTO}
STREAM_TYPES = {"application/connect+json": JSON, "application/connect+proto": PROTO}


async def handle(request: Request, method: Method, guard: Guard, translate: Translate) -> Response:
    """Serves one call of `method`: errors before a stream starts answer as a unary error would."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    types = STREAM_TYPES if method.streaming or method.client_streaming else UNARY_TYPES
    codec = types.get(media)
    if codec is None:
        kinds = ", ".join(types)
        return _error(RpcError("invalid_argument", f"content type {media or 'none'!r}: send one of {kinds}"),
                      status=415)
    try:
        call = Call(request, _deadline(request.headers.get("connect-timeout-ms")))
        call.context = await guard(request)
        if method.client_streaming:
            answer = await method.handler(call, _messages(request, codec, method.request))  # type: ignore[misc]
            return Response(_envelope(0, codec.encode(answer)) + _envelope(END_STREAM, b"{}"), media_type=media)
        raw = await request.body()
        message = codec.decode(_unwrap(raw) if method.streaming else raw, method.request)
        if not method.streaming:
            answer = await method.handler(call, message)  # type: ignore[misc]
            return Response(codec.encode(answer), media_type=media)
        events = method.handler(call, message)
        first = await anext(events)  # type: ignore[call-overload]
    except StopAsyncIteration:
        first = None
    except Exception as error:
        return _error(error if isinstance(error, RpcError) else translate(error))
    return StreamingResponse(_stream(codec, first, events, translate), media_type=media)


async def _stream(codec: Codec, first: Message | None, events: AsyncIterator[Message],
                  translate: Translate) -> AsyncIterator[bytes]:
    end: dict[str, Any] = {}
    try:
        if first is not None:
            yield _envelope(0, codec.encode(first))
            async for event in events:
                yield _envelope(0, codec.encode(event))
    except Exception as error:
        end = {"error": (error if isinstance(error, RpcError) else translate(error)).body()}
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    yield _envelope(END_STREAM, json.dumps(end).encode())


def _envelope(flags: int, data: bytes) -> bytes:
    return ENVELOPE.pack(flags, len(data)) + data


async def _messages(request: Request, codec: Codec, kind: type[Message]) -> AsyncIterator[Message]:
    """A client stream's messages, each as soon as its envelope is whole."""
    buffer = b""
    async for chunk in request.stream():
        buffer += chunk
        while len(buffer) >= ENVELOPE.size:
            flags, length = ENVELOPE.unpack_from(buffer)
            if flags & COMPRESSED:
                raise RpcError("unimplemented", "compressed messages are not accepted: send them uncompressed")
            if length > MAX_MESSAGE:
                raise RpcError("resource_exhausted", f"a message of {length} bytes: send at most {MAX_MESSAGE}")
            if len(buffer) < ENVELOPE.size + length:
                break
            raw, buffer = buffer[ENVELOPE.size:ENVELOPE.size + length], buffer[ENVELOPE.size + length:]
            if not flags & END_STREAM:
                yield codec.decode(raw, kind)
    if buffer:
        raise RpcError("invalid_argument", "the request stream ended inside an envelope")


def _unwrap(raw: bytes) -> bytes:
    """The one message of a server-streaming request's body."""
    if len(raw) < ENVELOPE.size:
        raise RpcError("invalid_argument", "the request is not an enveloped message")
    flags, length = ENVELOPE.unpack_from(raw)
    if flags & COMPRESSED:
        raise RpcError("unimplemented", "compressed messages are not accepted: send them uncompressed")
    if len(raw) != ENVELOPE.size + length:
        raise RpcError("invalid_argument", "a server-streaming request carries exactly one enveloped message")
    return raw[ENVELOPE.size:]


def _deadline(header: str | None) -> float | None:
    if header is None:
        return None
    if not header.isdigit() or len(header) > 10:
        raise RpcError("invalid_argument", f"connect-timeout-ms {header!r}: give at most 10 digits")
    return time.monotonic() + int(header) / 1000


def _error(error: RpcError, status: int | None = None) -> Response:
    return Response(json.dumps(error.body()), status or STATUS[error.code], media_type="application/json")
