"""Runs one block against a server and judges it: None when it did what it says, else the failure's message.

The message names the block by its place (`docs/tasks.md:121`) and says how to mark a block that is not meant to
run, for whoever wrote it (the rules: conftest.py).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.docs.blocks import NO_RUN, Block, expected_prints, matches

RUN_PYTHON = Path(__file__).with_name("run_python.py")
DOCS_URL = "http://127.0.0.1:8080"
"""Where the docs say the server is: `rollbox serve`'s default. In a block it means the tier's server."""
BLOCK_TIMEOUT = 180


def check(block: Block, server: str, workspace: Path) -> str | None:
    try:
        done, printed = run(block, server, workspace)
    except subprocess.TimeoutExpired:
        return failed(block, f"ran longer than {BLOCK_TIMEOUT} s")
    if done.returncode != 0:
        return failed(block, f"exited with {done.returncode}", done)
    for (first, last), expected in (expected_prints(block.code) if block.language == "python" else {}).items():
        said = "".join(text for line, text in sorted(printed.items()) if first <= line <= last)
        if not matches(expected, said):
            return failed(block, f"printed {said!r} at {block.path}:{block.doc_line(last)}, where its comment says "
                                 f"{expected!r} (the comment after a print is what it prints; `...` stands for any "
                                 "text)", done)
    return None


def check_parses(block: Block) -> str | None:
    """A no-run Python block must still be Python."""
    try:
        compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as error:
        where = f"{block.path}:{block.doc_line(error.lineno or 0)}"
        return f"{where}: the ```python {NO_RUN} block does not parse: {error.msg}"
    return None


def run(block: Block, server: str, workspace: Path) -> tuple[subprocess.CompletedProcess[str], dict[int, str]]:
    """Runs the block in `workspace` against `server`: its exit and, for Python, what each line printed."""
    code = block.code.replace(DOCS_URL, server)
    env = {**os.environ, "ROLLBOX_URL": server, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONUNBUFFERED": "1"}
    env.pop("ROLLBOX_TOKEN", None)
    if block.language != "python":
        return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=workspace, env=env,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT), {}
    source, prints = workspace / ".block.py", workspace / ".prints.json"
    source.write_text(code)
    prints.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, str(RUN_PYTHON), str(source), block.where, str(prints)], cwd=workspace,
                          env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    printed = {int(line): text for line, text in json.loads(prints.read_text()).items()} if prints.exists() else {}
    return done, printed


def failed(block: Block, what: str, done: subprocess.CompletedProcess[str] | None = None) -> str:
    output = f"\n--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-5000:]}" if done else ""
    return (f"{block.where}: the ```{block.language} block {what}.{output}\nIf this block is not meant to run, mark it "
            f"so in its info string: ```{block.language} {NO_RUN} (the rules: tests/docs/conftest.py).")
