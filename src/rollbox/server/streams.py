"""NDJSON answers fed while work runs: command output as it is produced, build progress as it happens."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import Response, StreamingResponse

from rollbox.errors import RollboxError
from rollbox.server.failures import logged

log = logging.getLogger("rollbox.server")

Emit = Callable[[dict[str, Any]], None]
FIRST_EVENT_WAIT = 0.2
"""How long to hold the answer for a first event: failures before any output come within milliseconds."""
_END = object()
_NOTHING = object()


async def ndjson(produce: Callable[[Emit], Awaitable[None]], error_event: Callable[[RollboxError], dict[str, Any]]
                 ) -> Response:
    """Runs `produce`, streaming each event it emits as one JSON line.

    Holds the answer up to FIRST_EVENT_WAIT for the first event, so that a failure before any
    output (an unknown sandbox, a paused one) is a plain error response with its status; a later
    failure becomes the stream's last line, `error_event(error)`. A client that hangs up cancels
    the work.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def run() -> None:
        try:
            await produce(queue.put_nowait)
        except Exception as error:
            queue.put_nowait(error)
        queue.put_nowait(_END)

    task = asyncio.create_task(run())
    try:
        first = await asyncio.wait_for(queue.get(), FIRST_EVENT_WAIT)
    except TimeoutError:
        first = _NOTHING
    if isinstance(first, Exception):
        raise first

    async def lines() -> AsyncIterator[bytes]:
        try:
            item = first if first is not _NOTHING else await queue.get()
            while item is not _END:
                if isinstance(item, Exception):
                    item = error_event(as_rollbox_error(item))
                yield (json.dumps(item) + "\n").encode()
                item = await queue.get()
        finally:
            task.cancel()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def as_rollbox_error(error: Exception) -> RollboxError:
    """The error to show a client, logged as what it is (failures.py); anything unexpected is shown as `internal`."""
    return logged(error, log, "a stream")
