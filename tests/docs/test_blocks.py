"""The tier's own parts, without a server: reading blocks, what a print says, and the failure each mistake gives."""

from __future__ import annotations

from pathlib import Path

from tests.docs.blocks import Block, expected_prints, matches, read_blocks
from tests.docs.check import check, check_parses

DOC = '''# A page

```python
print(6 * 7)  # 42
```

- a list item:

  ```bash no-run
  make train
  ```

````markdown
```python
not a block of its own
```
````

```yaml
kind: SandboxTemplate
```
'''
NOWHERE = "http://127.0.0.1:1"
"""No block below calls a server: the tier's would do, but these need none."""


def block_of(tmp_path: Path, language: str, code: str) -> Block:
    (tmp_path / "docs").mkdir(exist_ok=True)
    page = tmp_path / "docs" / "new.md"
    page.write_text(f"# New\n\n```{language}\n{code}```\n")
    (block,) = read_blocks(page, tmp_path)
    return block


def test_blocks_are_read_with_their_place_language_and_marker(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(DOC)
    blocks = read_blocks(tmp_path / "README.md", tmp_path)
    assert [(b.where, b.language, b.options, b.runs) for b in blocks] == [
        ("README.md:3", "python", (), True), ("README.md:9", "bash", ("no-run",), False),
        ("README.md:13", "markdown", (), False), ("README.md:19", "yaml", (), False)]
    assert blocks[0].code == "print(6 * 7)  # 42\n" and blocks[1].code == "make train\n"
    assert "not a block of its own" in blocks[2].code
    assert blocks[0].doc_line(1) == 4


def test_the_comment_after_a_print_is_its_output() -> None:
    code = 'x = 1  # not a print\nprint(\n    x,\n    2)  # 1 2\nprint("free")\n'
    assert expected_prints(code) == {(2, 4): "1 2"}
    assert matches("1 2", "1 2\n") and matches("/tmp hi", "/tmp\nhi\n\n") and not matches("1 2", "1 3")
    assert matches("[Info(id=..., tag='web', ...)]", "[Info(id='ab12', pid=8, tag='web', running=True)]")
    assert not matches("[Info(id=..., tag='web', ...)]", "[Info(id='ab12', tag='db')]")


def test_a_block_that_does_what_it_says_passes(tmp_path: Path) -> None:
    python = block_of(tmp_path, "python", "import asyncio\nawait asyncio.sleep(0)\nprint(6 * 7)  # 42\n"
                                          'print("http://127.0.0.1:8080")  # http://127.0.0.1:1\n')
    assert check(python, NOWHERE, tmp_path) is None
    bash = block_of(tmp_path, "bash", 'test "$ROLLBOX_URL" = http://127.0.0.1:1\n')
    assert check(bash, NOWHERE, tmp_path) is None


def test_a_failing_block_says_where_and_how_to_mark_it(tmp_path: Path) -> None:
    wrong = check(block_of(tmp_path, "python", "print(6 * 7)  # 41\n"), NOWHERE, tmp_path)
    assert wrong is not None and wrong.startswith(
        "docs/new.md:3: the ```python block printed '42\\n' at docs/new.md:4, where its comment says '41'")
    assert "mark it so in its info string: ```python no-run" in wrong
    raised = check(block_of(tmp_path, "python", "import sys\nsys.exit(3)\n"), NOWHERE, tmp_path)
    assert raised is not None and raised.startswith("docs/new.md:3: the ```python block exited with 3")
    failing = check(block_of(tmp_path, "bash", "false\necho never\n"), NOWHERE, tmp_path)
    assert failing is not None and "exited with 1" in failing and "never" not in failing.split("--- stderr")[0]
    assert "```bash no-run" in failing


def test_a_no_run_python_block_must_still_parse(tmp_path: Path) -> None:
    assert check_parses(block_of(tmp_path, "python no-run", "await client.run(...)\n")) is None
    broken = check_parses(block_of(tmp_path, "python no-run", "x = 1\nprint(x\n"))
    assert broken is not None and broken.startswith("docs/new.md:") and "does not parse" in broken
