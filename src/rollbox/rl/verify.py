"""Verification: the hidden tests enter the sandbox, run, and their outcomes become the reward.

One exec does everything (see `testrun`), so the agent gets no chance to act between the tests
being written and being run. Outcomes count only from the line carrying this call's nonce.
"""

from __future__ import annotations

import ast
import secrets
import shlex
import time
from importlib import resources
from typing import Literal

from pydantic import BaseModel

from rollbox import tracing
from rollbox.client import AsyncSandbox
from rollbox.rl.tasks import HiddenTests, Task

Outcome = Literal["passed", "failed", "missing"]
_SOURCE = resources.files("rollbox.rl").joinpath("testrun.py").read_text()
VERIFY_MARGIN = 10.0
"""Seconds the whole verification may take beyond the tests' own timeout (killing, writing, starting Python)."""


class Verdict(BaseModel):
    reward: float
    resolved: bool
    """Every FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes."""
    fail_to_pass: dict[str, Outcome]
    pass_to_pass: dict[str, Outcome]
    log: str = ""
    """Failure messages (or the test command's output): for people, never shown to the agent."""
    duration_ms: float = 0.0

    def summary(self) -> str:
        """The agent-facing line: counts only, so it is the same on every replay."""
        f2p = sum(o == "passed" for o in self.fail_to_pass.values())
        p2p = sum(o == "passed" for o in self.pass_to_pass.values())
        return (f"reward {self.reward:g}: FAIL_TO_PASS {f2p}/{len(self.fail_to_pass)} passed, "
                f"PASS_TO_PASS {p2p}/{len(self.pass_to_pass)} passed")


def judge(tests: HiddenTests, outcomes: dict[str, Outcome], log: str = "") -> Verdict:
    """SWE-bench's rule: resolved only when all F2P pass and all P2P pass; partial credit is optional."""
    f2p = {test: outcomes.get(test, "missing") for test in tests.fail_to_pass}
    p2p = {test: outcomes.get(test, "missing") for test in tests.pass_to_pass}
    resolved = all(o == "passed" for o in (*f2p.values(), *p2p.values()))
    if resolved:
        reward = 1.0
    elif tests.partial_credit:
        reward = _fraction(f2p) * _fraction(p2p)
    else:
        reward = 0.0
    return Verdict(reward=reward, resolved=resolved, fail_to_pass=f2p, pass_to_pass=p2p, log=log)


def _fraction(outcomes: dict[str, Outcome]) -> float:
    return sum(o == "passed" for o in outcomes.values()) / len(outcomes) if outcomes else 1.0


def script(task: Task, nonce: str) -> str:
    tests = task.tests
    payload = {"nonce": nonce, "workdir": task.workdir, "clean": list(tests.clean), "files": tests.files,
               "patch": tests.patch,
               "tests": list(dict.fromkeys((*tests.fail_to_pass, *tests.pass_to_pass))),
               "command": tests.command, "per_test_timeout": tests.per_test_timeout}
    return f"{_SOURCE}\nmain({payload!r})\n"


def parse(stdout: str, nonce: str) -> tuple[dict[str, Outcome], str] | None:
    """The outcomes on the last line that starts with the nonce, or None when there is none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(nonce + " "):
            report = ast.literal_eval(line[len(nonce) + 1:])
            return report["outcomes"], report["log"]
    return None


async def verify(sandbox: AsyncSandbox, task: Task) -> Verdict:
    """Runs the hidden tests in `sandbox` (which the agent can no longer use) and judges them."""
    if not tracing.on:
        return await _verify(sandbox, task)
    with tracing.span("rollbox.rl.verify", {"rollbox.rl.task": task.id, "rollbox.sandbox.id": sandbox.id}) as span:
        verdict = await _verify(sandbox, task)
        span.set_attributes({"rollbox.rl.reward": verdict.reward, "rollbox.rl.resolved": verdict.resolved})
        return verdict


async def _verify(sandbox: AsyncSandbox, task: Task) -> Verdict:
    started = time.perf_counter()
    nonce = secrets.token_hex(16)
    tests = task.tests
    result = await sandbox.commands.run([*shlex.split(tests.python), "-s", "-B", "-"], stdin=script(task, nonce),
                                        cwd="/", timeout=tests.timeout + VERIFY_MARGIN)
    parsed = parse(result.stdout, nonce)
    if parsed is None:
        why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
        verdict = judge(tests, {}, f"the test run {why} before reporting:\n{result.stdout[-4000:]}"
                                   f"{result.stderr[-4000:]}")
    else:
        verdict = judge(tests, *parsed)
    verdict.duration_ms = (time.perf_counter() - started) * 1000
    return verdict
