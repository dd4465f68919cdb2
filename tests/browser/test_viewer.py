"""The trajectory viewer in Chromium over a real run: episodes collected by the RL layer on real sandboxes, shown
by `rollbox view` and by the dashboard's Trajectories tab."""

from __future__ import annotations

import asyncio
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


async def policy(observation: Observation) -> Any:
    """Prints markup into its observation, then fixes the task on even members and submits."""
    if observation.step == 0:
        return {"tool": "bash", "command": f"echo '{MARKUP}'"}
    fixes = list(TASK.solution or []) if int(observation.episode_id.rsplit("/", 1)[1]) % 2 == 0 else []
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
    process = subprocess.Popen([str(ROLLBOX), "view", str(run.parent), "--no-browser"], stdout=subprocess.PIPE,
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
    """The page lists every episode of the run with its reward, shows the steps of the one chosen, and draws the
    reward curve one point per iteration."""
    expected = episodes(run)
    page.wait_for_selector(".episodes tbody tr", timeout=WAIT * 1000)
    shown = page.eval_on_selector_all(".episodes tbody tr", "rows => rows.map(row => [row.dataset.id, "
                                      "row.querySelector('.reward').textContent])")
    assert sorted(shown) == sorted([e["episode_id"], str(int(e["reward"]))] for e in expected)
    assert {e["reward"] for e in expected} == {0.0, 1.0}, "the run has both outcomes"
    assert page.get_attribute("[data-role=reward-curve]", "data-points") == "2"
    solved = next(e for e in expected if e["reward"] == 1.0)
    page.click(f'.episodes tr[data-id="{solved["episode_id"]}"]')
    assert page.locator(".episode .step").count() == len(solved["steps"])
    assert page.text_content(".episode h3") == solved["episode_id"]
    assert MARKUP in page.text_content('.step[data-step="0"] pre.observation')
    assert "cpu_seconds" in page.text_content(".episode table.fields")
    cpu = (solved.get("cost") or {}).get("cpu_seconds", solved["cpu_seconds"])
    assert page.text_content(f'.episodes tr[data-id="{solved["episode_id"]}"] .cpu') == f"{cpu:.3f}"
    page.select_option("[data-role=order]", "reward-desc")
    assert page.text_content(".episodes tbody tr:first-child .reward") == "1"
    assert page.locator(".episode img").count() == 0 and page.evaluate("window.__pwned") is None


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
