"""Exiting on SIGTERM through the clean-up, for every rollbox process: servers, trainers, benchmarks.

It sits on the ground floor, importing nothing of rollbox, so that a process of any layer can use it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


def exit_on_sigterm() -> None:
    """Exits on SIGTERM by raising SystemExit, so that what the process opened still closes (the default action
    kills it first). uvicorn shuts down gracefully on SIGTERM, then raises it again."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)


@contextlib.contextmanager
def sigterm_held() -> Iterator[None]:
    """Holds back a SIGTERM that arrives in the block until the block is over, then lets it act as it would have: a
    child process started in the block is then known to its parent, which can stop it on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda number, _: arrived.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if arrived:
            signal.raise_signal(signal.SIGTERM)


def _exit(*_: object) -> None:
    raise SystemExit(0)
