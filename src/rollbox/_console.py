"""The consoles every command prints through: rich's, wrapped only where a person reads them at a terminal's width.

Rich wraps to the terminal's width, and to 80 columns when the output is no terminal (a pipe, a file, a CI log),
which breaks a table's rows and a long line (a socket path) in two. Off a terminal these consoles never wrap, so
`grep`, `cut` and a log viewer see each row whole. It sits on the ground floor so that the CLI and the trainer
print alike.
"""

from __future__ import annotations

from typing import IO

from rich.console import Console

UNWRAPPED_WIDTH = 100_000
"""Columns of a console that is no terminal: wider than any line a command prints, so none wraps."""


def make_console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console on stdout (stderr, or `file`): a terminal's width on a terminal, rows never wrapped elsewhere."""
    terminal = Console(stderr=stderr, file=file, highlight=False)
    if terminal.is_terminal:
        return terminal
    return Console(stderr=stderr, file=file, highlight=False, width=UNWRAPPED_WIDTH, soft_wrap=True)
