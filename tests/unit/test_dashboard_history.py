"""The bounded history behind the dashboard's charts and its command log: fixed memory whatever the load."""

from __future__ import annotations

from rollbox.server.dashboard.history import COMMANDS_PER_SANDBOX, SLOT_SECONDS, SLOTS, CommandLog, LatencyHistory


def test_the_latency_history_keeps_ten_minutes_in_fixed_memory() -> None:
    history = LatencyHistory()
    start = 1_000_000.0
    for n in range(100):
        history.add(0.010, now=start)
        history.add(0.020 if n else 2.0, now=start + SLOT_SECONDS)
    first, second = history.series(now=start + SLOT_SECONDS)
    assert (first["t"], first["count"]) == (start, 100) and 0.0099 < first["p50"] < 0.0135
    assert second["count"] == 100 and 0.019 < second["p50"] < 0.027 and 0.019 < second["p99"] < 0.027
    history.add(0.5, now=start + SLOT_SECONDS * SLOTS)  # lands in the first slot's place, ten minutes on
    assert [p["t"] for p in history.series(now=start + SLOT_SECONDS * SLOTS)] == [start + SLOT_SECONDS,
                                                                                  start + SLOT_SECONDS * SLOTS]


def test_the_command_log_keeps_the_last_commands_of_each_sandbox() -> None:
    log = CommandLog()
    for n in range(COMMANDS_PER_SANDBOX + 10):
        log.add("sb-1", "alice", f"echo {n}", 0, 0.001)
    log.add("sb-2", "bob", "x" * 5000, None, 1.0)
    kept = [entry["command"] for entry in log.tail("sb-1")]
    assert kept == [f"echo {n}" for n in range(10, COMMANDS_PER_SANDBOX + 10)]
    assert len(log.tail("sb-2")[0]["command"]) == 1000
    log.keep_only({"sb-2"})
    assert log.tail("sb-1") == [] and len(log.tail("sb-2")) == 1
