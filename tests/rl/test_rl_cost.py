"""Cost per rollout: each trajectory carries its claim's cost, and the training summary sums it per iteration and per
task and prices it with the table it was given."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from rollbox._console import make_console
from rollbox.errors import InvalidRequest
from rollbox.models import ClaimCost
from rollbox.rl.collect import Observation, collect_async
from rollbox.rl.cost import PriceTable, load_prices, micro, summarize
from rollbox.rl.train import TrainConfig, train
from tests.support.servers import example_tasks

pytestmark = pytest.mark.anyio
TASK = example_tasks()[0]
BURN = "python3 -c \"import time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass\""


async def burn_then_submit(observation: Observation) -> Any:
    return [{"tool": "bash", "command": BURN}, {"tool": "submit"}][observation.step]


async def test_a_trajectory_carries_its_claims_cost_to_the_last_command(url: str, tmp_path: Path) -> None:
    trajectories = await collect_async(burn_then_submit, [TASK], url=url, group_size=2, progress=False,
                                       out=tmp_path / "trajectories.jsonl")
    for trajectory in trajectories:
        cost = trajectory.cost
        assert cost is not None and trajectory.error is None
        assert cost.cpu_seconds >= 1.0, "the burn and the hidden tests ran on the claim"
        assert cost.cpu_seconds <= (trajectory.cpu_seconds or 0) + 0.01, "never more than its cgroup counted"
        assert cost.memory_gb_seconds > 0 and cost.wall_seconds > 1.0 and cost.samples >= 2
    stored = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert all(record["cost"]["cpu_seconds"] >= 1.0 for record in stored)


def test_the_summary_prices_each_iteration_and_task(url: str, tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("machine_type: test-machine\ncpu_hour: 3.6\ngb_hour: 36\ncurrency: EUR\n")
    output = io.StringIO()
    report = train(TrainConfig(iterations=2, group_size=2, task_ids=[TASK.id], url=url, out_dir=tmp_path / "run",
                               progress=False, prices=prices), make_console(file=output))
    table = load_prices(prices)
    trajectories = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    costs = [ClaimCost(**t["cost"]) for t in trajectories]
    assert report.cost.episodes == 4 and report.cost.price == pytest.approx(sum(table.price(c) for c in costs))
    assert report.cost.price == pytest.approx(sum(c.cpu_seconds * 0.001 + c.memory_gb_seconds * 0.01 for c in costs))
    for stats in report.iterations:
        assert stats.cost.episodes == 2 and stats.tasks[TASK.id] == stats.cost
    assert report.tasks[TASK.id] == report.cost
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["prices"]["machine_type"] == "test-machine" and summary["cost"]["price"] == report.cost.price
    printed = output.getvalue().splitlines()
    header = next(line.split() for line in printed if "success" in line)
    assert header[-2:] == ["µEUR/episode", "µEUR/iter"], "prices print in millionths of the table's currency"
    rows = [line.split() for line in printed if line.split()[:1] in (["0"], ["1"])]
    assert [row[-2:] for row in rows] == [[micro(s.cost.price_per_episode), micro(s.cost.price)]
                                          for s in report.iterations]
    assert all(float(row[-1]) > 0 for row in rows)
    assert f"cost on test-machine: {micro(report.cost.price)} µEUR ({micro(report.cost.price_per_episode)} µEUR " \
           "per episode;" in output.getvalue()


def test_a_millionth_of_a_dollar_shows() -> None:
    assert micro(2.4e-6) == "2.40" and micro(0.0) == "0.00" and micro(1.5) == "1500000.00"
    assert PriceTable(machine_type="m", cpu_hour=1, gb_hour=1).micro_unit == "µUSD"


def test_price_tables() -> None:
    table = PriceTable(machine_type="m", cpu_hour=1.0, gb_hour=2.0, disk_gb_hour=4.0)
    assert table.price(ClaimCost(cpu_seconds=3600, memory_gb_seconds=1800, disk_gb_seconds=900)) == 3.0
    assert summarize([None, ClaimCost(cpu_seconds=36)], table).episodes == 1


@pytest.mark.parametrize("text", ["machine_type: m\ncpu_hour: -1\ngb_hour: 1\n", "cpu_hour: 1\n", "[unclosed",
                                  "machine_type: m\ncpu_hour: 1\ngb_hour: 1\ncpu_hours: 2\n"])
def test_a_bad_price_table_says_what_is_wrong(tmp_path: Path, text: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(InvalidRequest, match="price table"):
        load_prices(path)
    with pytest.raises(InvalidRequest, match="cannot read"):
        load_prices(tmp_path / "missing.yaml")
