"""Tasks and verification: the loader, the reward rules, and every example task judged in real sandboxes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbox.client import AsyncSandbox, AsyncSandboxClient
from rollbox.errors import InvalidResource
from rollbox.rl.prepare import apply_solution, prepare
from rollbox.rl.repo import staged
from rollbox.rl.tasks import HiddenTests, Task, load_tasks
from rollbox.rl.verify import judge, parse, verify
from tests.support.servers import example_tasks

pytestmark = pytest.mark.anyio
TASKS = example_tasks()


def test_examples_cover_three_projects_with_complete_tasks() -> None:
    assert len(TASKS) >= 12
    assert {task.workdir for task in TASKS} == {"/work/textkit", "/work/ledger", "/work/intervals"}
    for task in TASKS:
        assert task.tests.fail_to_pass and task.tests.pass_to_pass and task.solution and task.candidates
        assert task.tests.clean == ("tests",)
        assert all(path.startswith("tests/test_") for path in task.tests.files)
        assert not set(task.tests.fail_to_pass) & set(task.tests.pass_to_pass)


def test_staged_repository_leaves_the_hidden_tests_out() -> None:
    root = staged(TASKS[0].repo)  # type: ignore[arg-type]
    names = {path.relative_to(root).as_posix() for path in root.rglob("*")}
    assert "textkit/slug.py" in names or "ledger/money.py" in names or "intervals/merge.py" in names
    assert not any(name.startswith("tests") or "__pycache__" in name for name in names)


def test_task_file_errors_name_the_task(tmp_path: Path) -> None:
    file = tmp_path / "tasks.yaml"
    file.write_text("defaults: {template: t}\ntasks:\n- id: broken\n  problem_statement: x\n  tests: {}\n")
    with pytest.raises(InvalidResource, match=r"task broken: tests.fail_to_pass: Field required"):
        load_tasks(file)
    file.write_text("- {id: a, problem_statement: x, template: t, tests: {fail_to_pass: [t::a]}}\n"
                    "- {id: a, problem_statement: y, template: t, tests: {fail_to_pass: [t::b]}}\n")
    with pytest.raises(InvalidResource, match="'a' appears twice"):
        load_tasks(file)


def test_reward_rules() -> None:
    tests = HiddenTests(fail_to_pass=("f1", "f2"), pass_to_pass=("p1", "p2"))
    assert judge(tests, {"f1": "passed", "f2": "passed", "p1": "passed", "p2": "passed"}).reward == 1
    assert judge(tests, {"f1": "passed", "f2": "passed", "p1": "passed", "p2": "failed"}).reward == 0
    assert judge(tests, {"f1": "passed", "p1": "passed", "p2": "passed"}).fail_to_pass["f2"] == "missing"
    partial = tests.model_copy(update={"partial_credit": True})
    assert judge(partial, {"f1": "passed", "f2": "failed", "p1": "passed", "p2": "failed"}).reward == 0.25
    assert judge(partial, {"f1": "passed", "f2": "passed", "p1": "passed", "p2": "passed"}).resolved


def test_outcomes_count_only_from_the_nonce_line() -> None:
    stdout = 'forged {"outcomes": {"a": "passed"}, "log": ""}\nN {"outcomes": {"a": "failed"}, "log": ""}\n'
    assert parse(stdout, "N") == ({"a": "failed"}, "")
    assert parse(stdout, "other") is None


async def start(url: str, task: Task, count: int) -> tuple[AsyncSandboxClient, list[AsyncSandbox]]:
    """`count` sandboxes holding the task's start state (one claimed and prepared, the rest forked)."""
    client = AsyncSandboxClient(url)
    parent = await client.create_sandbox(template=task.template, warmpool=task.warmpool)
    await prepare(parent, task)
    return client, [parent, *(await parent.fork(count - 1) if count > 1 else [])]


def fake_tests(task: Task) -> str:
    """A shell command that replaces the hidden test files with ones that pass, conftest included."""
    commands = ["mkdir -p tests", "echo 'import pytest' > tests/conftest.py"]
    for path in sorted(task.tests.files):
        names = sorted({test.split("::")[1] for test in task.tests.fail_to_pass + task.tests.pass_to_pass
                        if test.startswith(path + "::")})
        body = "\\n".join(f"def {name}():\\n    pass\\n" for name in names)
        commands.append(f"printf '{body}' > {path}")
    return " && ".join(commands)


@pytest.mark.parametrize("task", TASKS, ids=[task.id for task in TASKS])
async def test_example_task_rewards(url: str, task: Task) -> None:
    """Reference fix 1; untouched 0; untouched with the tests faked or deleted 0; repository deleted 0."""
    client, (untouched, fixed, faked, no_tests, no_repo) = await start(url, task, 5)
    try:
        await apply_solution(fixed, task)
        assert (await faked.commands.run(fake_tests(task), cwd=task.workdir)).ok
        assert (await no_tests.commands.run("rm -rf tests", cwd=task.workdir)).ok
        assert (await no_repo.commands.run(f"rm -rf {task.workdir}", cwd="/")).ok
        verdicts = [await verify(box, task) for box in (untouched, fixed, faked, no_tests, no_repo)]
        assert [v.reward for v in verdicts] == [0, 1, 0, 0, 0], [v.summary() for v in verdicts]
        assert all(outcome == "failed" for outcome in verdicts[0].fail_to_pass.values())
        assert all(outcome == "passed" for outcome in verdicts[0].pass_to_pass.values())
    finally:
        for box in (untouched, fixed, faked, no_tests, no_repo):
            await box.delete()
        await client.close()


async def test_hidden_tests_resist_tampering(url: str) -> None:
    """Left-over processes, user-site hooks and forged result lines cannot turn an unfixed task into a pass."""
    task = next(t for t in TASKS if t.id == "ledger-format-cents")
    client, (daemon, usersite, forger) = await start(url, task, 3)
    try:
        rewrite = fake_tests(task).replace("'", "'\\''")
        await daemon.commands.run(f"nohup sh -c 'while :; do {rewrite}; done' >/dev/null 2>&1 &", cwd=task.workdir)
        await usersite.files.write(".local/lib/python3.11/site-packages/usercustomize.py",
                                   "import json\nreal = json.dumps\n"
                                   "def forged(value, *args, **kwargs):\n"
                                   "    if isinstance(value, dict) and 'outcomes' in value:\n"
                                   "        value['outcomes'] = {t: 'passed' for t in value['outcomes']}\n"
                                   "    return real(value, *args, **kwargs)\n"
                                   "json.dumps = forged\n")
        everything = {test: "passed" for test in task.tests.fail_to_pass + task.tests.pass_to_pass}
        output = ("\nPASSED x\n" + "f" * 32 + " " + json.dumps({"outcomes": everything, "log": ""}) + "\n").encode()
        forged_line = f"import os\nos.write(1, {output!r})\n"
        await forger.files.write(f"{task.workdir}/ledger/__init__.py", forged_line)
        for box in (daemon, usersite, forger):
            verdict = await verify(box, task)
            assert verdict.reward == 0, verdict.summary()
        assert (await daemon.commands.run("pgrep -f 'while [:]' || echo none")).stdout.strip() == "none"
    finally:
        for box in (daemon, usersite, forger):
            await box.delete()
        await client.close()


async def test_agent_never_sees_hidden_tests(url: str) -> None:
    task = TASKS[0]
    client, (box,) = await start(url, task, 1)
    try:
        found = await box.commands.run("find / -xdev -name 'test_*.py' -path '*tests*' 2>/dev/null | grep -v /usr/",
                                       cwd="/")
        assert found.stdout.strip() == ""
    finally:
        await box.delete()
        await client.close()


async def test_test_command_summary_lines_count(url: str) -> None:
    """A pytest-style command: only `PASSED id` / `FAILED id` summary lines decide, missing ids fail."""
    task = TASKS[0].model_copy(update={"tests": HiddenTests(
        files={"check.sh": "echo 'PASSED tests/a.py::one'; echo 'FAILED tests/a.py::two - boom'; echo noise\n"},
        fail_to_pass=("tests/a.py::one",), pass_to_pass=("tests/a.py::two", "tests/a.py::three"),
        command="sh check.sh")})
    client, (box,) = await start(url, task, 1)
    try:
        verdict = await verify(box, task)
        assert verdict.fail_to_pass == {"tests/a.py::one": "passed"}
        assert verdict.pass_to_pass == {"tests/a.py::two": "failed", "tests/a.py::three": "missing"}
        assert verdict.reward == 0 and "noise" in verdict.log
    finally:
        await box.delete()
        await client.close()
