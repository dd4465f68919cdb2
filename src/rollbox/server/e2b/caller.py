"""Who a call to E2B's in-sandbox daemon is for, and what its caller is told of a failure.

Every call names its sandbox (`E2b-Sandbox-Id`) and carries the access token the REST API gave out with it
(access.py); one whose token does not open that sandbox, or whose sandbox is gone, answers as E2B's proxy
does for a sandbox that is not there (502, "... was not found"), which the SDK reads as
`SandboxNotRunningException`. The other failures answer in the codes the SDK maps to its exceptions.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.responses import JSONResponse, Response

from rollbox.errors import (
    Conflict,
    InvalidRequest,
    NodeLost,
    NotFound,
    RollboxError,
    SandboxNotFound,
    SandboxNotRunning,
    TooLarge,
    Unauthorized,
)
from rollbox.server.e2b.connect import RpcError

log = logging.getLogger("rollbox.server.e2b")


@dataclass(frozen=True)
class Sandbox:
    tenant: str
    id: str


class SandboxGone(RollboxError):
    """The sandbox is not there for this caller: deleted, another tenant's, or a token that does not open it."""

    code = "sandbox_not_found"
    status = 502


def gone_message(sandbox_id: str) -> str:
    return f"The sandbox {sandbox_id} was not found"


def rpc_error(error: Exception) -> RpcError:
    """What a call's caller is told of a failure, in the codes the SDK maps to its exceptions."""
    if isinstance(error, SandboxGone | SandboxNotFound | SandboxNotRunning | NodeLost):
        return RpcError("unavailable", f"{error} (the sandbox was not found)")
    if isinstance(error, NotFound):
        return RpcError("not_found", str(error))
    if isinstance(error, Conflict):
        return RpcError("already_exists", str(error))
    if isinstance(error, Unauthorized):
        return RpcError("unauthenticated", str(error))
    if isinstance(error, TooLarge):
        return RpcError("resource_exhausted", str(error))
    if isinstance(error, InvalidRequest):
        return RpcError("invalid_argument", str(error))
    if isinstance(error, ValidationError):  # a request rollbox's models refuse (a working directory too long, ...)
        return RpcError("invalid_argument", f"invalid arguments: {error.errors(include_url=False)}")
    if isinstance(error, RollboxError):
        return RpcError("unavailable", str(error))
    log.error("E2B daemon call failed", exc_info=error)
    return RpcError("internal", f"the server failed: {error}; see its log")


def http_error(error: RollboxError) -> Response:
    """A failure of the daemon's plain HTTP endpoints, as `{"code": <status>, "message"}`."""
    if isinstance(error, SandboxGone | SandboxNotFound | SandboxNotRunning | NodeLost):
        return JSONResponse({"code": 502, "message": f"{error} (the sandbox was not found)"}, 502)
    if error.status >= 500:
        log.error("E2B daemon call failed", exc_info=error)
    return JSONResponse({"code": error.status, "message": str(error)}, error.status)


def basic_user(authorization: str | None) -> str | None:
    """The user an `Authorization: Basic <user:>` header names (the SDK's `user=`), else the sandbox's own."""
    scheme, _, encoded = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode().partition(":")[0] or None
    except (binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("the Authorization header is not basic credentials of a user") from None
