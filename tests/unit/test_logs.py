"""What failures are logged as (server/failures.py): a traceback only for what nobody expected, one line for an answer
a caller must expect, and a line that repeats held back for a while (rollbox._logs)."""

from __future__ import annotations

import logging

import pytest
from starlette.requests import ClientDisconnect

from rollbox import _logs, errors
from rollbox.server.failures import logged

log = logging.getLogger("rollbox.test")


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_logs, "_last", {})


def test_expected_answers_are_one_line_and_bugs_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "rollbox.test")
    down = errors.NodeUnavailable("node w1 is down", retry=False)
    assert logged(down, log, "a request") is down
    assert logged(errors.NoWarmSandbox("no warm sandbox here"), log, "a request").status == 404
    assert logged(ClientDisconnect(), log, "a request").code == "connection_failed"
    bug = logged(ValueError("boom"), log, "a request")
    assert (bug.status, str(bug)) == (500, "the server failed: boom; see its log")
    logged(errors.RollboxError("internal"), log, "a request")
    records = [(record.levelname, record.getMessage(), record.exc_info is not None) for record in caplog.records]
    assert records == [
        ("WARNING", "a request answered 503 node_unavailable: node w1 is down", False),
        ("INFO", "a request answered 404 no_warm_sandbox: no warm sandbox here", False),
        ("INFO", "a request: the caller hung up before sending its request", False),
        ("ERROR", "a request failed", True),
        ("ERROR", "a request failed", True)]


def test_a_line_that_repeats_is_written_once_in_a_while_with_a_count(caplog: pytest.LogCaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, "rollbox.test")
    now = [100.0]
    monkeypatch.setattr(_logs.time, "monotonic", lambda: now[0])
    for node in ("w1", "w2", "w3"):
        _logs.throttled(log, logging.WARNING, "node %s did not answer", node)
    _logs.throttled(log, logging.WARNING, "another kind of line %s", 1)
    now[0] += _logs.EVERY
    _logs.throttled(log, logging.WARNING, "node %s did not answer", "w4")
    assert [record.getMessage() for record in caplog.records] == [
        "node w1 did not answer", "another kind of line 1",
        f"node w4 did not answer (and 2 more like it in the last {_logs.EVERY:.0f} s)"]
