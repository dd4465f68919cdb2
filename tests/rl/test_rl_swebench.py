"""SWE-bench rows: a local git repository, its gold patch and test patch, judged in real sandboxes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rollbox.client import AsyncSandboxClient
from rollbox.rl.prepare import apply_solution, prepare
from rollbox.rl.swebench import load_swebench
from rollbox.rl.verify import verify

pytestmark = pytest.mark.anyio

OPS = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = "from calc.ops import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
FIXED_OPS = OPS.replace("return a - b", "return a + b", 1)
NEW_TESTS = TESTS.replace("import sub", "import add, sub") + "\n\ndef test_add():\n    assert add(2, 2) == 4\n"
MORE_TESTS = "from calc.ops import add\n\n\ndef test_add_zero():\n    assert add(5, 0) == 5\n"


def make_row(root: Path) -> dict[str, str]:
    """A checkout with a bug at its base commit; the gold and test patches come from `git diff`."""
    checkout = root / "acme__calc"
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    files = {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": TESTS}
    for path, text in files.items():
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text(text)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)

    def diff(changes: dict[str, str]) -> str:
        for path, text in changes.items():
            (checkout / path).write_text(text)
        subprocess.run([*git, "add", "-A"], check=True)
        patch = subprocess.run([*git, "diff", "--cached"], capture_output=True, text=True, check=True).stdout
        subprocess.run([*git, "reset", "-q", "--hard"], check=True)
        return patch

    gold = diff({"calc/ops.py": FIXED_OPS})
    test_patch = diff({"tests/test_ops.py": NEW_TESTS, "tests/test_more.py": MORE_TESTS})
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (checkout / "calc" / "ops.py").write_text("changed after the base commit: must not reach the sandbox\n")
    return {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": commit, "patch": gold,
            "test_patch": test_patch, "problem_statement": "add() subtracts.", "version": "1.0",
            "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_add", "tests/test_more.py::test_add_zero"]),
            "PASS_TO_PASS": json.dumps(["tests/test_ops.py::test_sub"])}


def test_rows_become_tasks(tmp_path: Path) -> None:
    row = make_row(tmp_path)
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    (task,) = load_swebench(tmp_path / "rows.jsonl", repos=tmp_path, template="rl-python")
    assert task.id == "acme__calc-1" and task.solution == row["patch"]
    assert task.repo is not None and task.repo.commit == row["base_commit"]
    assert task.tests.fail_to_pass == ("tests/test_ops.py::test_add", "tests/test_more.py::test_add_zero")
    assert set(task.tests.files) == {"tests/test_ops.py", "tests/test_more.py"}
    assert task.tests.files == {"tests/test_ops.py": NEW_TESTS, "tests/test_more.py": MORE_TESTS}
    assert task.tests.command == "python -m pytest -rA -p no:cacheprovider tests/test_more.py tests/test_ops.py"
    assert task.metadata == {"repo": "acme/calc", "base_commit": row["base_commit"], "version": "1.0"}


async def test_swebench_task_rewards(url: str, tmp_path: Path) -> None:
    (task,) = load_swebench([make_row(tmp_path)], repos=tmp_path, template="rl-python", workdir="/work/calc",
                            test_command=None)
    async with AsyncSandboxClient(url) as client:
        parent = await client.create_sandbox(template=task.template)
        await prepare(parent, task)
        untouched, fixed, faked = [parent, *await parent.fork(2)]
        assert (await untouched.files.read("/work/calc/calc/ops.py")).decode() == OPS
        assert (await untouched.commands.run("git status --short", cwd=task.workdir)).stdout == ""
        await apply_solution(fixed, task)
        await faked.files.write("/work/calc/tests/test_ops.py", "def test_add():\n    pass\n\n\ndef test_sub():\n"
                                "    pass\n")
        rewards = [(await verify(box, task)).reward for box in (untouched, fixed, faked)]
        assert rewards == [0, 1, 0]
        for box in (untouched, fixed, faked):
            await box.delete()
