"""The trajectory viewer in Chromium over a real run: episodes collected by the RL layer on real sandboxes, shown
by `rollbox view` and by the dashboard's Trajectories tab."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox.rl.collect import Observation, collect_async
from tests.browser.conftest import WAIT, eventually, sign_in
from tests.support.servers import TOKENS, example_tasks

ROLLBOX = Path(sys.executable).with_name("rollbox")
TASK = next(task for task in example_tasks() if task.id == "ledger-format-cents")
MARKUP = "<img src=x onerror=window.__pwned=3>"
BREAK_TRANSFER = "sed -i 's/def transfer(/def moved(/' ledger/account.py; "


def member(episode_id: str) -> int:
    return int(episode_id.rsplit("/", 1)[1])


async def policy(observation: Observation) -> Any:
    """Prints markup into its observation; on odd members also breaks `transfer` (failing tests that passed
    before) and exits 3; then fixes the task on even members, and submits."""
    if observation.step == 0:
        odd = member(observation.episode_id) % 2
        return {"tool": "bash", "command": f"echo '{MARKUP}'; {BREAK_TRANSFER if odd else ''}exit {odd * 3}"}
    fixes = list(TASK.solution or []) if member(observation.episode_id) % 2 == 0 else []
    script = [{"tool": "str_replace", "path": e.path, "old": e.old, "new": e.new} for e in fixes] + [{"tool": "submit"}]
    return script[observation.step - 1]


@pytest.fixture(scope="module")
def run(server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run of two iterations: two episodes each, half of them solved."""
    out = tmp_path_factory.mktemp("run") / "trajectories.jsonl"

    async def collect() -> None:
        for iteration in range(2):
            await collect_async(policy, [TASK], url=server, token=TOKENS["alice"], group_size=2, concurrency=2,
                                tag=f"it{iteration}", out=out, progress=False)

    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API holds this thread's event loop
        thread.submit(asyncio.run, collect()).result()
    return out


@pytest.fixture
def viewer(run: Path) -> Iterator[str]:
    """`rollbox view` on the run's directory; yields the link it prints."""
    with viewing(run.parent) as link:
        yield link


@contextlib.contextmanager
def viewing(directory: Path) -> Iterator[str]:
    process = subprocess.Popen([str(ROLLBOX), "view", str(directory), "--no-browser"], stdout=subprocess.PIPE,
                               text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert " at http://127.0.0.1:" in line, f"rollbox view printed {line!r}"
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        process.terminate()
        process.wait(timeout=WAIT)


def episodes(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run.read_text().splitlines()]


def check_viewer(page: Any, run: Path) -> None:
    """The page lists every episode of the run with its reward, shows the one chosen as a timeline, and draws the
    reward curve one point per iteration."""
    expected = episodes(run)
    page.wait_for_selector(".episodes tbody tr", timeout=WAIT * 1000)
    shown = page.eval_on_selector_all(".episodes tbody tr", "rows => rows.map(row => [row.dataset.id, "
                                      "row.querySelector('.reward').textContent])")
    assert sorted(shown) == sorted([e["episode_id"], str(int(e["reward"]))] for e in expected)
    assert {e["reward"] for e in expected} == {0.0, 1.0}, "the run has both outcomes"
    assert page.get_attribute("[data-role=reward-curve]", "data-points") == "2"
    solved = next(e for e in expected if e["reward"] == 1.0)
    check_timeline(page, next(e for e in expected if e["reward"] == 0.0))
    check_timeline(page, solved)
    assert MARKUP in page.text_content('.step[data-step="0"] pre.observation')
    assert "cpu_seconds" in page.text_content(".episode table.fields")
    cpu = (solved.get("cost") or {}).get("cpu_seconds", solved["cpu_seconds"])
    assert page.text_content(f'.episodes tr[data-id="{solved["episode_id"]}"] .cpu') == f"{cpu:.3f}"
    page.select_option("[data-role=order]", "reward-desc")
    assert page.text_content(".episodes tbody tr:first-child .reward") == "1"
    assert page.locator(".episode img").count() == 0 and page.evaluate("window.__pwned") is None


def check_timeline(page: Any, episode: dict[str, Any]) -> None:
    """Each step in order: its tool, exit code, time, action and observation; then the verdict's tests, failed ones
    first."""
    page.click(f'.episodes tr[data-id="{episode["episode_id"]}"]')
    assert page.text_content(".episode h3") == episode["episode_id"]
    steps = episode["steps"]
    shown = page.eval_on_selector_all(".timeline .step", """steps => steps.map(step => ({
        tool: step.querySelector('.tool').textContent, exit: step.querySelector('.exit')?.textContent ?? null,
        time: step.querySelector('.time').textContent, action: step.querySelector('pre.action').textContent,
        observation: step.querySelector('pre.observation').textContent}))""")
    assert [s["tool"] for s in shown] == [step["action"]["tool"] for step in steps]
    assert [s["exit"] for s in shown] == [None if step["exit_code"] is None else f"exit {step['exit_code']}"
                                          for step in steps]
    assert steps[0]["exit_code"] == member(episode["episode_id"]) % 2 * 3, "the trajectory records the exit code"
    assert [s["observation"] for s in shown] == [step["observation"] for step in steps]
    assert shown[0]["action"] == f"$ {steps[0]['action']['command']}" and shown[-1]["action"] == "submit"
    at = 0.0
    for step, on_page in zip(steps, shown, strict=True):
        figures = [float(word) for word in on_page["time"].replace("·", " ").split() if word[0].isdigit()]
        at += step["policy_ms"]
        assert figures == pytest.approx([at / 1000, step["policy_ms"], step["sandbox_ms"]], abs=0.051), on_page
        at += step["sandbox_ms"]
    for index, step in enumerate(steps):
        if step["action"]["tool"] == "str_replace":
            diff = "\n".join([*(f"- {line}" for line in step["action"]["old"].split("\n")),
                               *(f"+ {line}" for line in step["action"]["new"].split("\n"))])
            assert page.text_content(f'.step[data-step="{index}"] pre.diff') == diff
    verdict = episode["verdict"]
    tests = [[name, kind, outcome] for kind, outcomes in (("FAIL_TO_PASS", verdict["fail_to_pass"]),
                                                          ("PASS_TO_PASS", verdict["pass_to_pass"]))
             for name, outcome in outcomes.items()]
    tests.sort(key=lambda row: row[2] == "passed")
    rows = page.eval_on_selector_all(".verdict table.tests tbody tr",
                                     "rows => rows.map(row => [...row.cells].map(cell => cell.textContent))")
    assert rows == tests and (rows[0][2] != "passed") == (not verdict["resolved"])
    if not verdict["resolved"]:  # a PASS_TO_PASS test the episode broke comes up before those that passed
        assert [row[1] for row in rows if row[2] != "passed"] == ["FAIL_TO_PASS", "PASS_TO_PASS", "PASS_TO_PASS"]
    assert page.text_content(".verdict h4").startswith(
        f"Verdict: reward {int(verdict['reward'])}, {'resolved' if verdict['resolved'] else 'not resolved'}; "
        f"{sum(row[2] == 'passed' for row in tests)} of {len(tests)} tests passed")


def with_model_calls(run: Path, out: Path) -> Path:
    """The run's episodes with the model calls a gateway would record on each step's record (`model_calls`: a list
    of {request, response, usage}); the trajectory has no field of its own for them yet, so they are added here to
    the real run's lines."""
    lines = []
    for episode in episodes(run):
        for number, step in enumerate(episode["steps"]):
            step["model_calls"] = [{
                "request": {"model": "policy-7b", "messages": [
                    {"role": "system", "content": "You fix bugs."},
                    {"role": "user", "content": f"step {number}: {MARKUP}"}]},
                "response": {"choices": [{"message": {"role": "assistant", "content": f"reply {number} {MARKUP}"}}]},
                "usage": {"prompt_tokens": 100 + number, "completion_tokens": 7}}] * (2 if number == 0 else 1)
        lines.append(json.dumps(episode))
    out.mkdir()
    path = out / "trajectories.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rollbox_view_shows_a_real_run(viewer: str, run: Path, page: Any) -> None:
    page.goto(viewer)
    check_viewer(page, run)
    assert "#token" not in page.evaluate("location.href"), "the token stayed in the address bar"
    assert page.text_content("#run-name") == f"{run.parent.name}/{run.name}"


@pytest.mark.console_errors("401 (Unauthorized)")
def test_rollbox_view_answers_only_to_its_token(viewer: str, page: Any) -> None:
    base = viewer.split("#", 1)[0]
    assert httpx.get(base.replace("/viewer", "/viewer/api/run")).status_code == 401
    page.goto(base)
    eventually(lambda: "needs the link" in (page.text_content("#viewer-error") or ""), "the page asks for the link")
    assert page.locator(".episodes").count() == 0


def test_the_dashboard_opens_a_run_in_the_browser(server: str, run: Path, page: Any) -> None:
    sign_in(page, server, TOKENS["bob"])
    page.click("#tab-trajectories")
    page.set_input_files("#run-file", str(run))
    check_viewer(page, run)


def test_the_timeline_shows_the_model_calls_a_step_carries(run: Path, page: Any, tmp_path: Path) -> None:
    path = with_model_calls(run, tmp_path / "with-calls")
    with viewing(path.parent) as link:
        page.goto(link)
        page.wait_for_selector(".timeline .step", timeout=WAIT * 1000)
        episode = next(e for e in episodes(path) if not e["resolved"])  # a failed test and a failed command too
        page.click(f'.episodes tr[data-id="{episode["episode_id"]}"]')
        for number, step in enumerate(episode["steps"]):
            calls = page.locator(f'.step[data-step="{number}"] .model-call')
            assert calls.count() == len(step["model_calls"])
            head = calls.first.locator(".label").first.text_content()
            assert head == f"model call 1 · policy-7b · prompt_tokens {100 + number} · completion_tokens 7"
            assert calls.first.locator("pre.response").text_content() == f"reply {number} {MARKUP}"
            roles = calls.first.locator(".message .role").all_text_contents()
            assert roles == ["system", "user"]
        page.click('.step[data-step="0"] .model-call >> nth=0 >> summary')
        assert page.locator('.step[data-step="0"] .model-call >> nth=0 >> .message pre').nth(1).text_content() == \
            f"step 0: {MARKUP}"
        assert page.locator(".episode img").count() == 0 and page.evaluate("window.__pwned") is None
