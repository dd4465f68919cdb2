"""Runs one Python block in a process of its own: `python run_python.py CODE_FILE NAME PRINTS_FILE`.

The block runs as a module named NAME (its place in the docs, so a traceback points there), with top-level
`await` allowed (a block may show the async client as a reader types it into `python -m asyncio`). What each
line's `print` calls printed goes to PRINTS_FILE as JSON ({line: text}), also when the block fails; only prints
of the block's own code count, not those of a callback it hands to the SDK (`on_stdout=print`).
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import inspect
import json
import sys
from pathlib import Path
from typing import Any


def main(code_file: str, name: str, prints_file: str) -> None:
    printed: dict[int, str] = {}
    shown = builtins.print

    def recording_print(*values: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None,
                        flush: bool = False) -> None:
        shown(*values, sep=sep, end=end, file=file, flush=flush)
        caller = sys._getframe(1)
        if file is None and caller.f_code.co_filename == name:
            text = (" " if sep is None else sep).join(map(str, values)) + ("\n" if end is None else end)
            printed[caller.f_lineno] = printed.get(caller.f_lineno, "") + text

    code = compile(Path(code_file).read_text(), name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    try:
        result = eval(code, {"__name__": "__main__", "print": recording_print})
        if inspect.iscoroutine(result):
            asyncio.run(result)
    finally:
        Path(prints_file).write_text(json.dumps(printed))


if __name__ == "__main__":
    main(*sys.argv[1:])
