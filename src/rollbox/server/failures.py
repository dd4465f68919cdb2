"""What a failed request is logged as: a traceback only for what nobody expected (a bug), one line for an answer its
caller must expect, each kind at most once per ten seconds (rollbox._logs).

A node that does not answer, a command past its time, a warm pool without a ready sandbox, a caller that hung up:
under a cluster of busy clients each happens thousands of times a minute, and a traceback for each buried the one
that mattered (docs/faults.md).
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect

from rollbox._logs import throttled
from rollbox.errors import ConnectionFailed, RollboxError


def logged(error: Exception, log: logging.Logger, what: str) -> RollboxError:
    """The error to answer `error` with, logged: with its traceback at ERROR when it is not one of rollbox's errors,
    or rollbox's internal one; else one line, at WARNING for a 5xx and INFO for a 4xx."""
    if isinstance(error, ClientDisconnect):
        throttled(log, logging.INFO, f"{what}: the caller hung up before sending its request")
        return ConnectionFailed("the caller hung up before sending its request")
    if not isinstance(error, RollboxError):
        log.error("%s failed", what, exc_info=error)
        return RollboxError(f"the server failed: {error}; see its log")
    if error.code == RollboxError.code:
        log.error("%s failed", what, exc_info=error)
    else:
        level = logging.WARNING if error.status >= 500 else logging.INFO
        throttled(log, level, f"{what} answered {error.status} {error.code}: %s", error)
    return error
