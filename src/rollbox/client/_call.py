"""What one API call is, as data: the request to send and how to read its answer (`_calls` lists them all).

The blocking client, the asyncio client and a router forwarding to its node agents send the same `Call`s and
`StreamCall`s, each moving the bytes its own way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, TypeAdapter, ValidationError

from rollbox import errors
from rollbox._problems import problems
from rollbox.client._http import RETRY_DELAYS, Answer, error_from, raise_for_error

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
Parse = Callable[[Answer], T]
JSON = {"content-type": "application/json"}


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request whose answer comes whole."""

    method: str
    path: str
    parse: Parse[T]
    params: dict[str, str] | None = None
    body: str | bytes | None = None
    headers: dict[str, str] | None = None
    idempotent: bool = False
    """Safe to send again after a connection error or a 503."""
    wait: float | None = 0.0
    """Seconds the server may spend working beyond the client's timeout; None: no limit."""
    retried: dict[str, str] | None = None
    """Query parameters it carries when sent again (a claim's `retry`: an earlier attempt may have made it)."""
    delays: tuple[float, ...] = RETRY_DELAYS
    """Seconds to wait before each time it is sent again, when it is idempotent."""

    def again(self) -> Call[T]:
        """The call as sent again after a connection error or a 503."""
        if self.retried is None:
            return self
        return replace(self, params={**(self.params or {}), **self.retried}, retried=None)


class Reader(Protocol[T_co]):
    def feed(self, line: str) -> T_co | None:
        """Takes one NDJSON line; returns the call's result once it is complete."""


@dataclass(frozen=True, slots=True)
class StreamCall(Generic[T]):
    """One request whose answer is NDJSON, read line by line as it arrives. Never retried."""

    method: str
    path: str
    reader: Reader[T]
    body: str
    wait: float | None = None
    headers: dict[str, str] = field(default_factory=lambda: JSON)

    def answer(self) -> StreamAnswer[T]:
        return StreamAnswer(self)


class StreamAnswer(Generic[T]):
    """A StreamCall's answer as it is read: lines past the result are read too (a whole answer frees its
    connection for the next call) and ignored."""

    def __init__(self, call: StreamCall[T]) -> None:
        self._call = call
        self._result: T | None = None

    def feed(self, line: str) -> None:
        if line and self._result is None:
            self._result = self._call.reader.feed(line)

    def result(self) -> T:
        if self._result is None:
            raise errors.NodeUnavailable(f"{self._call.method} {self._call.path}: the answer stopped before it was "
                                         "complete; the server or the sandbox's node went away")
        return self._result


def _json(adapter: TypeAdapter[T]) -> Parse[T]:
    def parse(answer: Answer) -> T:
        return adapter.validate_json(raise_for_error(answer).content)

    return parse


def _none(answer: Answer) -> None:
    raise_for_error(answer)


def _content(answer: Answer) -> bytes:
    return raise_for_error(answer).content


def _exists(answer: Answer) -> bool:
    if answer.status_code == 404:
        error = error_from(answer)
        if isinstance(error, errors.FileNotFound):
            return False
        raise error
    raise_for_error(answer)
    return True


def _dump(body: BaseModel) -> str:
    return body.model_dump_json(exclude_none=True)


M = TypeVar("M", bound=BaseModel)


def _body(model: type[M], **fields: Any) -> M:
    """Builds a request body; a bad or misspelt argument fails here, as the server would fail it."""
    try:
        return model(**fields)
    except ValidationError as error:
        raise errors.InvalidRequest(f"invalid arguments: {problems(error)}") from None


def _name(name: str) -> str:
    """One path segment: an id or a name can never reach another route."""
    return quote(name, safe="")


def _get(path: str, parse: Parse[T], params: dict[str, str] | None = None) -> Call[T]:
    return Call("GET", path, parse, params=params, idempotent=True)


def _delete(path: str, params: dict[str, str] | None = None) -> Call[None]:
    return Call("DELETE", path, _none, params=params, idempotent=True)


def _post(path: str, parse: Parse[T], body: BaseModel | None = None) -> Call[T]:
    if body is None:
        return Call("POST", path, parse)
    return Call("POST", path, parse, body=_dump(body), headers=JSON)
