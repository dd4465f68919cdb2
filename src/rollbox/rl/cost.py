"""What rollouts cost in money: a machine type's prices applied to the claims' figures (rollbox.models.ClaimCost).

The node accounts each claim's CPU-seconds and memory and disk GB-seconds; a `PriceTable` says what an hour of
each costs on a machine type, so a training summary can say what an episode, a task and an iteration cost there.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollbox.errors import InvalidRequest
from rollbox.models import ClaimCost

DEFAULT_PRICES = Path(__file__).resolve().parents[3] / "examples" / "prices.yaml"


class PriceTable(BaseModel):
    """Prices per hour of one machine type's resources, in `currency`."""

    model_config = ConfigDict(extra="forbid")

    machine_type: str
    cpu_hour: float = Field(ge=0)
    """Per CPU-hour (one core busy for an hour)."""
    gb_hour: float = Field(ge=0)
    """Per GB-hour of memory."""
    disk_gb_hour: float = Field(0.0, ge=0)
    """Per GB-hour of the sandbox's own writes."""
    currency: str = "USD"

    def price(self, cost: ClaimCost) -> float:
        return (cost.cpu_seconds * self.cpu_hour + cost.memory_gb_seconds * self.gb_hour
                + cost.disk_gb_seconds * self.disk_gb_hour) / 3600

    @property
    def micro_unit(self) -> str:
        """The unit prices are printed in (`micro`): a millionth of the currency, `µUSD`."""
        return f"µ{self.currency}"


MICRO = 1_000_000


def micro(price: float) -> str:
    """A price in millionths of its currency, as printed: an episode costs a few millionths of a dollar, which six
    decimals of a dollar would show as 0.000000. Files (summary.json, trajectories) keep the price itself."""
    return f"{price * MICRO:.2f}"


def load_prices(path: str | Path) -> PriceTable:
    """A price table from YAML (`machine_type`, `cpu_hour`, `gb_hour`, optionally `disk_gb_hour`, `currency`)."""
    try:
        return PriceTable.model_validate(yaml.safe_load(Path(path).read_text()))
    except OSError as error:
        raise InvalidRequest(f"cannot read the price table {path}: {error.strerror}") from None
    except (yaml.YAMLError, ValidationError) as error:
        raise InvalidRequest(f"the price table {path} is not valid: {error}") from None


class CostSummary(BaseModel):
    """The summed cost of some episodes (an iteration's, a task's), and its price on the table's machine type."""

    episodes: int = 0
    cpu_seconds: float = 0.0
    memory_gb_seconds: float = 0.0
    disk_gb_seconds: float = 0.0
    wall_seconds: float = 0.0
    price: float = 0.0
    """In the price table's currency."""

    @property
    def price_per_episode(self) -> float:
        return self.price / self.episodes if self.episodes else 0.0


def summarize(costs: Iterable[ClaimCost | None], prices: PriceTable) -> CostSummary:
    """Sums the costs that were recorded (an episode whose sandbox was gone before its stats has none)."""
    total = CostSummary()
    for cost in costs:
        if cost is None:
            continue
        total.episodes += 1
        total.cpu_seconds += cost.cpu_seconds
        total.memory_gb_seconds += cost.memory_gb_seconds
        total.disk_gb_seconds += cost.disk_gb_seconds
        total.wall_seconds += cost.wall_seconds
        total.price += prices.price(cost)
    return total


def combine(summaries: Iterable[CostSummary]) -> CostSummary:
    """Several summaries as one (the iterations' as the run's)."""
    total = CostSummary()
    for summary in summaries:
        for name, value in summary:
            setattr(total, name, getattr(total, name) + value)
    return total
