"""What the sync and async clients share about HTTP: settings, answers, error decoding, retry policy."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from urllib.parse import urlencode

import httpx
from pydantic import ValidationError

from rollbox import errors
from rollbox._version import __version__
from rollbox.models import ErrorBody

DEFAULT_URL = "http://127.0.0.1:8080"
UNIX = "unix://"
"""A router on a unix socket: `unix:///path/to/router.sock` (the embedded server's own, see rollbox.server.local)."""
DEFAULT_TIMEOUT = 60.0
URL_CACHE = 4096
"""Parsed URLs kept, by path: a claim's calls reuse theirs rather than parse them again."""
RETRY_DELAYS = (0.1, 0.4, 1.6)
"""Seconds to wait before each retry of an idempotent call that hit a connection error or a 503 (but not one that
says sending it again will not help: `worth_again`)."""
CLAIM_RETRY_DELAYS = (0.1, 0.4, 1.6, 3.2, 6.4)
"""The same for a claim with a request key: it waits out a router's restart (seconds), since a claim given up on may
have made a sandbox that nobody holds until its lease or `shutdown_after` ends it."""

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
"""Methods whose requests say their body's length even when it is empty."""

_BY_STATUS: dict[int, type[errors.RollboxError]] = {
    400: errors.InvalidRequest, 401: errors.Unauthorized, 403: errors.Forbidden, 404: errors.NotFound,
    409: errors.Conflict, 413: errors.TooLarge, 422: errors.InvalidRequest, 429: errors.CapacityExceeded,
    502: errors.NodeUnavailable, 503: errors.NodeUnavailable, 504: errors.NodeUnavailable,
}
"""The error class for answers that carry no error body of ours (a proxy's 502, a framework's 422)."""


Timeouts = dict[str, float | None]
"""Seconds allowed to connect, read, write and wait for a pooled connection (httpx's names: `Timeout.as_dict()`)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer, as the calls read it; each client makes one from what its transport received."""

    method: str
    path: str
    status_code: int
    reason_phrase: str
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


class Settings:
    """Where the router is and how to talk to it; both clients hold one."""

    def __init__(self, base_url: str | None, token: str | None, timeout: float) -> None:
        self.base_url = (base_url or os.environ.get("ROLLBOX_URL") or DEFAULT_URL).rstrip("/")
        self.origin, self.socket = _address(self.base_url)
        """Where requests are addressed, and the unix socket they go through (None: TCP to the origin)."""
        token = token if token is not None else os.environ.get("ROLLBOX_TOKEN")
        self.headers = {"user-agent": f"rollbox-client/{__version__}"}
        if token:
            if not token.isprintable() or not token.isascii():
                raise errors.InvalidRequest("the token holds a control or non-ASCII character: give it as the server "
                                            "printed it")
            self.headers["authorization"] = f"Bearer {token}"
        origin = httpx.URL(self.origin)  # percent-encoded as httpx would send it
        self._prefix = origin.raw_path.decode("ascii").rstrip("/")
        """The router's path behind a proxy (`http://gateway/rollbox`), put before every call's own."""
        self._fields = "".join(f"{name}: {value}\r\n" for name, value in
                               {"host": origin.netloc.decode("ascii"), **self.headers}.items())
        self.seconds = timeout
        self._timeouts = httpx.Timeout(timeout).as_dict()
        self._url = functools.lru_cache(maxsize=URL_CACHE)(lambda path: httpx.URL(self.origin + path))

    def limits(self, max_connections: int) -> httpx.Limits:
        """One pool of `max_connections` kept-alive connections, for both clients."""
        return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)

    def http_client(self, max_connections: int, transport: httpx.BaseTransport | None = None) -> httpx.Client:
        """A blocking httpx client to the router, through its socket when it has one (the sync SDK's own)."""
        transport = transport or httpx.HTTPTransport(uds=self.socket, limits=self.limits(max_connections))
        # no proxies from the environment on a socket: they must not take requests meant for it
        return httpx.Client(transport=transport, trust_env=self.socket is None)

    def request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                content: str | bytes | None = None, headers: dict[str, str] | None = None,
                wait: float | None = 0.0) -> httpx.Request:
        """An httpx request to the router, built whole, for httpx clients (the sync SDK, health checks). An httpx
        client's own `request()` would parse the base URL and merge its headers, cookies and auth again on every
        call, for nothing the SDK uses."""
        return httpx.Request(method, self._url(path), params=params, content=content,
                             headers=self.headers if headers is None else {**self.headers, **headers},
                             extensions={"timeout": self.timeouts(wait)})

    def written(self, method: str, path: str, *, params: dict[str, str] | None = None,
                content: str | bytes | None = None, headers: dict[str, str] | None = None) -> bytes:
        """A request written out as HTTP/1.1, head and body (the async client's): `path` is percent-encoded
        already, as the calls make it."""
        target = f"{self.target(path)}?{urlencode(params)}" if params else self.target(path)
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items()) if headers else ""
        body = content.encode() if isinstance(content, str) else content or b""
        framing = f"content-length: {len(body)}\r\n" if body or method in _WITH_BODY else ""
        return f"{method} {target} HTTP/1.1\r\n{self._fields}{extra}{framing}\r\n".encode() + body

    def target(self, path: str) -> str:
        """A call's path as sent: after the router's own behind a proxy (`/rollbox/v1/...`)."""
        return self._prefix + path

    def timeouts(self, wait: float | None = 0.0) -> Timeouts:
        """The call's timeouts; `wait` is the seconds the server may spend working beyond the client's timeout
        (None: no limit)."""
        if wait == 0:
            return self._timeouts
        return httpx.Timeout(self.seconds, read=None if wait is None else self.seconds + wait).as_dict()


def _address(url: str) -> tuple[str, str | None]:
    if not url.startswith(UNIX):
        return url, None
    socket = url.removeprefix(UNIX)
    if not socket.startswith("/"):
        raise errors.InvalidRequest(f"{url}: give the socket's absolute path, as in unix:///run/rollbox/router.sock")
    return "http://localhost", socket


def answer_of(response: httpx.Response) -> Answer:
    """An httpx response, read, as the calls read answers; its path is the one sent, as the async client's is."""
    request = response.request
    path = request.url.raw_path.decode("ascii").partition("?")[0]
    return Answer(request.method, path, response.status_code, response.reason_phrase, response.content)


def raise_for_error(answer: Answer) -> Answer:
    if answer.is_success:
        return answer
    raise error_from(answer)


def error_from(answer: Answer) -> errors.RollboxError:
    """Rebuilds the typed error the server sent; falls back on the status for bodies that are not ours."""
    try:
        body = ErrorBody.model_validate_json(answer.content)
    except ValidationError:
        text = answer.text.strip()[:500] or answer.reason_phrase
        error_class = _BY_STATUS.get(answer.status_code, errors.RollboxError)
        return error_class(f"{answer.method} {answer.path} answered {answer.status_code}: {text}")
    return errors.from_code(body.error.code, body.error.message, body.error.retry)


def worth_again(answer: Answer) -> bool:
    """Whether an idempotent call that got `answer` is sent again: a 503, unless its error says the same call would
    fail again (a node known to be down)."""
    return answer.status_code == 503 and error_from(answer).retry is not False


def connection_failed(base_url: str, method: str, path: str, error: httpx.TransportError) -> errors.ConnectionFailed:
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return errors.ConnectionFailed(f"cannot reach the rollbox server at {base_url} ({error}): start it with "
                                "`rollbox serve`, or point ROLLBOX_URL (--url) at the one that runs")
    if isinstance(error, httpx.TimeoutException):
        return errors.ConnectionFailed(f"{method} {path}: the server at {base_url} did not answer in time: "
                                "raise the client's timeout, or check the server's load")
    return errors.ConnectionFailed(f"{method} {path} to {base_url} failed: {str(error) or type(error).__name__}")
