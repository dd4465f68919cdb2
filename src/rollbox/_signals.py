"""Exiting on SIGTERM through the clean-up, for every rollbox process: servers, trainers, benchmarks.

It sits on the ground floor, importing nothing of rollbox, so that a process of any layer can use it.
"""

from __future__ import annotations

import signal
import threading


def exit_on_sigterm() -> None:
    """Exits on SIGTERM by raising SystemExit, so that what the process opened still closes (the default action
    kills it first). uvicorn shuts down gracefully on SIGTERM, then raises it again."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)


def _exit(*_: object) -> None:
    raise SystemExit(0)
