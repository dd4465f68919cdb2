"""examples/tree_search end to end: its search, run as a user runs it against a router over a real engine, forks
gVisor sandboxes whose REPL carries the parent's memory, and reaches its goal."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rollbox.client import SandboxClient
from tests.support.servers import ADMINS, EXAMPLES, TOKENS, router

pytestmark = [pytest.mark.runsc, pytest.mark.slow]
SEARCH = EXAMPLES / "tree_search" / "search.py"
FIXES = {"member 500", "never negative", "bulk from 10"}
EDITS = 6
CHILD = re.compile(r"^  (?P<edit>\S.*?)\s+(?P<score>[\d.]+)%  answered in [\d.]+ s; held the parent's state: "
                   r"(?P<held>\w+) \(pid (?P<pid>\d+), token (?P<token>\w+), (?P<cases>\d+) cases, "
                   r"(?P<earlier>\d+) earlier edits\)$", re.M)
FORKED = re.compile(r"^forked (?P<id>\w+) \((?P<score>[\d.]+)%, path \[(?P<path>.*)\]\) (?P<ways>\d+) ways in "
                    r"[\d.]+ s$", re.M)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with router(tmp_path_factory.mktemp("tree-search"), TOKENS, ADMINS) as address:
        yield address


def test_the_search_forks_the_live_repl_and_reaches_its_goal(url: str) -> None:
    done = subprocess.run([sys.executable, str(SEARCH), "--url", url, "--token", TOKENS["alice"],
                           "--cases", "20000", "--beam", "1"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    root = re.search(r"as process (\w+) \(pid (\d+)\)\nthe REPL built 20000 test cases in [\d.]+ s \(session token "
                     r"(\w+)\); the buggy total\(\) passes ([\d.]+)%", out)
    assert root, out
    pid, token, root_score = root[2], root[3], float(root[4])

    # every expansion forked the best node one way per edit not yet on its path (beam 1: a greedy descent)
    forks = [m.groupdict() for m in FORKED.finditer(out)]
    assert [int(f["ways"]) for f in forks] == [EDITS - depth for depth in range(len(forks))], out
    assert float(forks[0]["score"]) == root_score and forks[0]["path"] == ""
    assert len({f["id"] for f in forks}) == len(forks)  # each node its own sandbox

    # every child's REPL answered from the parent's memory: the same process, the session's token and tests, and
    # the parent's edits before its own
    children = [m.groupdict() for m in CHILD.finditer(out)]
    assert len(children) == sum(int(f["ways"]) for f in forks), out
    for child in children:
        assert (child["held"], child["pid"], child["token"], child["cases"]) == ("yes", pid, token, "20000"), child
    start = 0
    for depth, fork in enumerate(forks):
        group = children[start:start + int(fork["ways"])]
        start += len(group)
        assert {int(child["earlier"]) for child in group} == {depth}
        assert len({child["edit"] for child in group}) == len(group)
        # the scores are the REPL's own: each fix raises the share of passing tests, the harmful edits sink it
        best = max(group, key=lambda child: float(child["score"]))
        assert best["edit"] in FIXES and float(best["score"]) > float(fork["score"])
        assert all(float(child["score"]) < 1 for child in group if child["edit"] in ("not member", "in cents"))
        if depth + 1 < len(forks):
            assert forks[depth + 1]["path"].split(", ")[-1] == repr(best["edit"])

    # the goal: every test passes after the three fixes, and the function is the fixed one
    path = re.search(r"^best path: (.+): 100\.0% of 20000 tests pass \(goal reached\)$", out, re.M)
    assert path, out
    assert set(path[1].split(" -> ")) == FIXES and len(forks) == len(FIXES)
    assert "    if qty >= 10:\n" in out and "        cost = cost - 500\n" in out and "    return max(cost, 0)\n" in out

    # the search deleted every sandbox it made
    with SandboxClient(url, token=TOKENS["alice"]) as client:
        assert client.list_sandboxes() == []
