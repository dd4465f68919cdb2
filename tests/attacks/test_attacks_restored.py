"""The attack suite against sandboxes restored from a checkpoint (gVisor): the attacker's sandbox has been saved to
disk and restored (a standby and its resume), so its exec agent, socket, limits and isolation are the restored ones.

The attacks are the other modules' own, collected here again with this module's `box`; only the runtime that can
checkpoint runs them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollbox.engine import Container, Engine
from tests.attacks import (
    test_attacks_files,
    test_attacks_host,
    test_attacks_limits,
    test_attacks_network,
    test_attacks_privilege,
    test_attacks_processes,
)
from tests.attacks.attack_support import new_sandbox

ATTACKS = (test_attacks_files, test_attacks_host, test_attacks_limits, test_attacks_network, test_attacks_privilege,
           test_attacks_processes)
globals().update({name: value for module in ATTACKS for name, value in vars(module).items()
                  if not name.startswith("_")})  # their tests, and the fixtures of their own they ask for


@pytest.fixture
def box(attack_engine: Engine, runtime_name: str) -> Iterator[Container]:
    """The attacker's sandbox, saved to disk with a process running and restored under the same id."""
    if not attack_engine.runtime(runtime_name).checkpoints:
        pytest.skip(f"{runtime_name} cannot checkpoint: its sandboxes are never restored")
    with new_sandbox(attack_engine, runtime_name) as sandbox:
        sandbox.exec("nohup sleep 77777 >/dev/null 2>&1 &")
        sandbox.pause()
        assert sandbox.info.state == "standby"
        sandbox.resume()
        assert sandbox.exec("pgrep -x sleep").exit_code == 0, "the restored sandbox runs on"
        yield sandbox
