"""Where a trial's time goes on rollbox's side, written beside Harbor's own result of the trial (`rollbox.json` in
its trial directory): the environment's start, each call's cost beyond the command it ran, transfers, teardown.

Nothing here imports Harbor: `bench/harbor.py` reads these files beside Harbor's `result.json`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

FILE = "rollbox.json"


@dataclass
class Account:
    template: str = ""
    sandbox: str = ""
    built: bool = False
    """Whether this trial built its template; the others of the same environment waited for that build or found
    the template there."""
    build_s: float = 0.0
    """Building (or finding) the template, waiting for another trial's build included."""
    claim_s: float = 0.0
    """Claiming the sandbox: a cold start of the template with the task's limits."""
    start_s: float = 0.0
    """The whole start: the template, the claim, Harbor's directories."""
    exec_calls: int = 0
    exec_s: float = 0.0
    """Wall time of every command call."""
    command_s: float = 0.0
    """The commands' own run time, as the sandbox measured it: the task's, not rollbox's."""
    upload_s: float = 0.0
    download_s: float = 0.0
    stop_s: float = 0.0

    @property
    def rollbox_s(self) -> float:
        """rollbox's share of the trial: everything above but the commands' own time."""
        return self.start_s + self.exec_s - self.command_s + self.upload_s + self.download_s + self.stop_s

    @contextlib.contextmanager
    def timing(self, field: str) -> Iterator[None]:
        """Adds the wall time of the block to `field` (`upload_s`, `download_s`, ...)."""
        started = time.monotonic()
        try:
            yield
        finally:
            setattr(self, field, getattr(self, field) + time.monotonic() - started)

    def write(self, trial_dir: Path) -> None:
        (trial_dir / FILE).write_text(json.dumps({**asdict(self), "rollbox_s": self.rollbox_s}, indent=2) + "\n")


def read(trial_dir: Path) -> dict[str, float] | None:
    """A trial's account, or None when its environment never started."""
    path = trial_dir / FILE
    return json.loads(path.read_text()) if path.is_file() else None
