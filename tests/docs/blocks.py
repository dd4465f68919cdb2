"""The code blocks of the README and docs/*.md, and what a Python block says it prints.

Read by the tier's tests (the rules are in conftest.py): no server, no subprocess, so the reading itself is
checked alone (test_blocks.py).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = ("python", "bash", "sh")
"""The languages whose blocks run; a block of any other (yaml, text, a diagram) never does."""
NO_RUN = "no-run"
"""The word in a block's info string that says it is not meant to run: ```python no-run."""
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    path: str
    """Relative to the repository: README.md, docs/api.md."""
    line: int
    """The line of its opening fence, counted from 1."""
    language: str
    options: tuple[str, ...]
    code: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUNS and NO_RUN not in self.options

    def doc_line(self, code_line: int) -> int:
        """The line of the document that holds line `code_line` (from 1) of the block."""
        return self.line + code_line


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def read_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of a Markdown file (an indented fence, in a list, counts; its indent is taken off)."""
    blocks: list[Block] = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        index += 1
        if not opening:
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        words = opening["info"].split()
        start, body = index, []
        while index < len(lines):
            text = lines[index]
            index += 1
            if text.strip().startswith(fence[0] * len(fence)) and not text.strip().strip(fence[0]):
                break
            body.append(text[indent:] if text[:indent].strip() == "" else text.lstrip())
        blocks.append(Block(str(path.relative_to(root)), start, words[0].lower() if words else "",
                            tuple(word.lower() for word in words[1:]), "\n".join(body) + "\n"))
    return blocks


def every_block(root: Path = ROOT) -> list[Block]:
    return [block for path in documents(root) for block in read_blocks(path, root)]


# -- what a Python block says it prints ---------------------------------------------------------------

def print_calls(code: str) -> list[tuple[int, int]]:
    """The lines (first, last) of every `print(...)` call in the code."""
    return [(node.lineno, node.end_lineno or node.lineno) for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def expected_prints(code: str) -> dict[tuple[int, int], str]:
    """The comment at the end of each `print(...)` call (on its last line): what the call must print."""
    comments = {token.start[0]: token.string[1:].strip()
                for token in tokenize.generate_tokens(io.StringIO(code).readline) if token.type == tokenize.COMMENT}
    return {(first, last): comments[last] for first, last in print_calls(code) if last in comments}


def matches(expected: str, printed: str) -> bool:
    """Whether `printed` is `expected`, comparing words (runs of whitespace and line ends are one space), with
    `...` standing for any text."""
    pattern = ".*?".join(re.escape(" ".join(part.split())) for part in expected.split("..."))
    return re.fullmatch(pattern, " ".join(printed.split()), re.DOTALL) is not None
