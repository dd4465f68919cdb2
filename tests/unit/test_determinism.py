"""The host's side of deterministic sandboxes (docs/determinism.md): seeds, the machine a sandbox is told of, and the
agent's state as the host packs it."""

from __future__ import annotations

import pytest

from rollbox.engine import determinism
from rollbox.errors import InvalidRequest
from rollbox.spec import Limits, TemplateSpec


def test_a_seed_gives_a_start_and_its_children_seeds_of_their_own() -> None:
    start, boot = determinism.start_of(7)
    assert (start, boot) == determinism.start_of(7) != determinism.start_of(8)
    assert start % determinism.SECOND == 0 and 60 * determinism.SECOND <= start - boot <= 3660 * determinism.SECOND
    assert start > (determinism.EPOCH + 30 * 86400) * determinism.SECOND
    children = [determinism.child_seed(7, index) for index in range(8)]
    assert len(set(children)) == 8 and children == [determinism.child_seed(7, index) for index in range(8)]
    assert all(0 <= seed <= determinism.MAX_SEED for seed in children)


def test_settings_come_from_the_template_or_the_claims_seed() -> None:
    limits = Limits(cpu=1.5, memory="1Gi")
    assert determinism.settings(TemplateSpec(), limits, None) is None
    assert determinism.settings(TemplateSpec(deterministic=True), limits, None) == \
        {"seed": 0, "kernel": "6.1.0-rollbox", "cpus": 2, "memory": 2**30}
    assert determinism.settings(TemplateSpec(), limits, 5)["seed"] == 5
    for seed in (-1, 2**63, True):
        with pytest.raises(InvalidRequest):
            determinism.settings(TemplateSpec(), limits, seed)  # type: ignore[arg-type]


def test_the_machine_files_tell_the_template_not_the_host() -> None:
    files = determinism.machine_files({"seed": 3, "kernel": "6.1.0-rollbox", "cpus": 4, "memory": 2**31})
    assert "MemTotal:        2097152 kB" in files["meminfo"]
    assert files["cpuinfo"].count("processor\t:") == 4 and files["online"] == "0-3\n"
    start, boot = determinism.start_of(3)
    assert f"btime {boot // determinism.SECOND}\n" in files["stat"]
    uptime = (start - boot) / determinism.SECOND
    assert files["uptime"] == f"{uptime:.2f} {4 * uptime:.2f}\n"


def test_a_fork_goes_on_from_the_parents_state_with_the_childs_streams() -> None:
    state = determinism._STATE.pack(9, 123, 45, 67, 1000, 1, 0) + b"x" * 16
    same = determinism.continued_state(state, 9)
    child = determinism.continued_state(state, 10)
    assert same == state
    assert determinism._STATE.unpack_from(child) == (10, 123, 45, 67, 0, 1, 0) and child.endswith(b"x" * 16)
    seed, now, boot, born, fifo, anchors, _ = determinism._STATE.unpack_from(determinism.fresh_state(9))
    assert (seed, (now, boot), born, fifo, anchors) == (9, determinism.start_of(9), 0, 0, 0)
