"""SIGTERM held back over a block (rollbox/_signals.py): what `LocalServer.start` starts its child under, so that a
trainer stopped as its embedded server starts still stops that server (tests/rl/test_rl_train.py runs the real one)."""

from __future__ import annotations

import os
import signal

from rollbox._signals import sigterm_held


def test_a_sigterm_in_the_block_acts_once_the_block_is_over() -> None:
    seen: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("SIGTERM"))
    try:
        with sigterm_held():
            os.kill(os.getpid(), signal.SIGTERM)
            seen.append("the block went on")
        assert seen == ["the block went on", "SIGTERM"]
        os.kill(os.getpid(), signal.SIGTERM)  # the handler from before is back
        assert seen == ["the block went on", "SIGTERM", "SIGTERM"]
    finally:
        signal.signal(signal.SIGTERM, previous)
