"""Deterministic sandboxes (docs/determinism.md): two episodes of the same commands on one template give the same
bytes, though the host's clock, load and uptime differ between them; seeds, forks and resets keep it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from rollbox.engine import Container, Engine
from rollbox.errors import InvalidRequest
from rollbox.spec import SandboxTemplate
from tests.support.determinism import PROBES, TEMPLATE, TEMPORARY_NAMES

STACK_PROGRAM = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
int main(void) {
    int local;
    pthread_attr_t attr;
    void *low;
    size_t size;
    pthread_getattr_np(pthread_self(), &attr);
    pthread_attr_getstack(&attr, &low, &size);
    printf("%p %s\n", (void *)&local, (char *)&local >= (char *)low && (char *)&local < (char *)low + size ?
           "within the stack it is told of" : "outside the stack it is told of");
    return 0;
}
"""
"""Where main's local variables are, and whether that is within the stack pthread_getattr_np tells of."""

pytestmark = pytest.mark.slow


def _name(runtime: str) -> str:
    return f"deterministic-{runtime}"


@pytest.fixture(scope="module")
def templates(engine: Engine) -> None:
    for runtime in ("runc", "runsc"):
        engine.build(SandboxTemplate.model_validate(
            {**TEMPLATE, "metadata": {"name": _name(runtime)}, "spec": {**TEMPLATE["spec"], "runtime": runtime}}))


@pytest.fixture
def deterministic(engine: Engine, templates: None, runtime: str) -> Iterator[Container]:
    with engine.create(_name(runtime)) as box:
        yield box


def _observe(box: Container, probes: list[tuple[str, str]] = PROBES) -> dict[str, str]:
    observations = {}
    for name, command in probes:
        result = box.exec(command, timeout=60)
        observations[name] = f"[{result.exit_code}]\n{result.stdout}[stderr]\n{result.stderr}"
    return observations


def _differing(first: dict[str, str], second: dict[str, str]) -> set[str]:
    return {name for name in first if first[name] != second[name]}


def _burn() -> subprocess.Popen:
    """Keeps a core of the host busy."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_two_episodes_of_the_same_commands_agree_byte_for_byte(engine: Engine, templates: None, runtime: str) -> None:
    probes = PROBES + TEMPORARY_NAMES
    with engine.create(_name(runtime)) as box:
        first = _observe(box, probes)
    time.sleep(1.3)  # the host's wall clock and uptime move on; the second episode runs under load
    burner = _burn()
    try:
        with engine.create(_name(runtime)) as box:
            second = _observe(box, probes)
    finally:
        burner.kill()
        burner.wait()
    assert all(text.startswith("[0]") for text in first.values()), first
    assert first["sort's files"].count("/tmp/sort") == 3 and "/tmp/tac" in first["tac's file"], first
    assert _differing(first, second) == set(), {name: (first[name], second[name])
                                                for name in _differing(first, second)}


def test_main_runs_on_a_stack_at_the_same_place_each_time_and_is_told_where(deterministic: Container) -> None:
    deterministic.files.write("/work/stack.c", STACK_PROGRAM)
    assert deterministic.exec("cc -o /work/stack /work/stack.c").exit_code == 0
    runs = [deterministic.exec("/work/stack").stdout for _ in range(2)]
    assert runs[0] == runs[1] and runs[0].endswith(" within the stack it is told of\n"), runs


def test_the_sandbox_tells_the_templates_machine_not_the_hosts(deterministic: Container) -> None:
    seen = _observe(deterministic, [(name, command) for name, command in PROBES
                                    if name in ("nproc", "id/hostname/uname", "free", "file written and listed",
                                                "date")])
    assert seen["nproc"].split()[1:4] == ["4", "4", "4"]
    assert "6.1.0-rollbox" in seen["id/hostname/uname"] and os.uname().release not in seen["id/hostname/uname"]
    assert "2097152" in seen["free"]
    assert " 2024-" in seen["file written and listed"]  # the time of the command that wrote it
    assert "2024" in seen["date"] and time.strftime("%Y") != "2024"


def test_a_seed_gives_its_own_episode_and_a_warm_sandbox_seeded_later_the_same(engine: Engine, templates: None,
                                                                                 runtime: str) -> None:
    probes = [(name, command) for name, command in PROBES if name in ("date", "uuid4", "/dev/urandom")]
    probes.append(("pids", "python3 -c 'import os; print(os.getpid(), os.getppid())'"))  # not ps: docs/determinism.md
    probes.append(("boot id", "cat /proc/sys/kernel/random/boot_id 2>/dev/null"))  # the seed's machine's
    with engine.create(_name(runtime), seed=7) as cold:
        seven = _observe(cold, probes)
        assert cold.info.seed == 7
    with engine.create(_name(runtime)) as warm:
        zero = _observe(warm, probes)
    with engine.create(_name(runtime)) as warm:
        engine.seed(warm.id, 7)  # what a claim with a seed does to a warm sandbox
        assert _observe(warm, probes) == seven
    own_boot_id = {"boot id"} if engine.runtime(runtime).own_boot_id else set()  # gVisor's /proc has none
    assert _differing(seven, zero) == {"date", "uuid4", "/dev/urandom", *own_boot_id}


def test_reset_returns_to_the_seeds_start(engine: Engine, deterministic: Container) -> None:
    probes = [(name, command) for name, command in PROBES if name in ("date", "uuid4", "file written and listed")]
    first = _observe(deterministic, probes)
    _observe(deterministic, probes)
    deterministic.reset()
    assert _observe(deterministic, probes) == first


def test_fork_children_have_seeds_of_their_own_given_by_the_parents(engine: Engine, templates: None,
                                                                   runtime: str) -> None:
    probes = [(name, command) for name, command in PROBES if name in ("date", "uuid4", "file written and listed")]
    groups = []
    for _ in range(2):
        with engine.create(_name(runtime), seed=11) as parent:
            parent.exec("echo before > fork.txt")
            children = parent.fork(2)
            try:
                assert len({child.info.seed for child in children}) == 2
                groups.append([_observe(child, probes) for child in children])
                groups[-1].append(_observe(parent, probes))
                listing = children[0].exec("ls -l --full-time fork.txt").stdout
                assert listing == parent.exec("ls -l --full-time fork.txt").stdout  # the parent's file, its time
            finally:
                for child in children:
                    child.delete()
    assert groups[0] == groups[1]  # the same parent, seed and commands: the same group
    first, second, parent_after = groups[0]
    assert "uuid4" in _differing(first, second) & _differing(first, parent_after)  # the members differ


def test_a_sandbox_that_is_not_deterministic_refuses_a_seed(engine: Engine, sandbox: Container) -> None:
    with pytest.raises(InvalidRequest):
        engine.seed(sandbox.id, 1)
    assert sandbox.info.seed is None
