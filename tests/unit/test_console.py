"""The consoles the CLI and the trainer print through: whole lines off a terminal, whatever COLUMNS says."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from rollbox._console import make_console

COMMAND = "sleep 300; : " + "a-long-argument-" * 8
LONG_LINE = "embedded server at unix:///tmp/rollbox-0123abcd/router.sock (data in /var/lib/rollbox-rl/" + "x" * 60 + ")"


def test_off_a_terminal_a_long_line_and_a_wide_tables_rows_stay_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    output = io.StringIO()
    console = make_console(file=output)
    table = Table("ID", "COMMAND", box=None, pad_edge=False)
    table.add_row("p1", COMMAND)
    console.print(LONG_LINE)
    console.print(table)
    lines = output.getvalue().splitlines()
    assert lines[0] == LONG_LINE
    assert lines[1].split() == ["ID", "COMMAND"] and lines[2].split(maxsplit=1) == ["p1", COMMAND]
    assert len(lines) == 3 and "\x1b" not in output.getvalue(), "wrapped, or coloured for a file"


def test_on_a_terminal_the_console_is_rich_s_own() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    console = make_console(file=Terminal())
    assert console.is_terminal and console.width < 10_000
