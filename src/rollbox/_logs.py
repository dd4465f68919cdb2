"""Log lines that repeat, written once in a while: a line with the same logger, level and text pattern is written at
most once per EVERY seconds, followed by how many like it were held back meanwhile.

A node that does not answer, a caller that hangs up, a command past its time: each is one line worth reading once,
and a flood when a cluster of busy clients meets it a thousand times a minute. It sits on the ground floor,
importing nothing of rollbox, so that every layer can use it.
"""

from __future__ import annotations

import logging
import threading
import time

EVERY = 10.0
"""Seconds between two lines of the same pattern."""

_last: dict[tuple[str, int, str], tuple[float, int]] = {}
"""(logger, level, pattern): when a line of it was last written, and how many were held back since."""
_lock = threading.Lock()


def throttled(log: logging.Logger, level: int, pattern: str, *args: object) -> None:
    """`log.log(level, pattern, *args)`, unless a line of the same pattern was written less than EVERY seconds ago."""
    if not log.isEnabledFor(level):
        return
    key, now = (log.name, level, pattern), time.monotonic()
    with _lock:
        last, held = _last.get(key, (-EVERY, 0))
        if now - last < EVERY:
            _last[key] = (last, held + 1)
            return
        _last[key] = (now, 0)
    if held:
        log.log(level, pattern + " (and %d more like it in the last %.0f s)", *args, held, now - last)
    else:
        log.log(level, pattern, *args)
