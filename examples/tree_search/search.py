"""Tree search over a live Python REPL, where every node of the tree is a gVisor sandbox and branching is a fork.

    .venv/bin/python examples/tree_search/search.py [--url URL [--token TOKEN]] [--cases N] [--beam K]

An agent working in a REPL builds up state as it goes: data it loaded, results it computed, the code it has edited so
far. To try several next steps from one point of such a session, the session must be copied, and its state lives in
a running process, not in files. Without live fork each branch would start a new interpreter and replay the whole
session up to that point (the setup, then every statement on the path), paying for it again at every node, and a
step that is not deterministic would not even replay the same. With gVisor's live fork, `sandbox.fork(n)` checkpoints
the sandbox once and restores n children that each carry the parent's processes and memory: the same REPL process,
with its variables, its stdin and its output, is running in every child, and the next statement runs there at once.

The search here is a toy, but an honest one: a function with bugs, `total()`, and candidate edits to it (some fix a
bug, one changes nothing, two do harm). The REPL builds its tests once (cases with the expected answers, the costly
state) and keeps the function's source. Each expansion forks a node's sandbox one way per edit not yet on its path,
sends each child's REPL that edit as its next statement, and scores the child by the share of the tests the edited
function passes, as the REPL answers it. A beam of the best children goes on; the others are deleted. It stops when
every test passes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rollbox import SandboxClient
from rollbox.client.sync import ProcessHandle, Sandbox
from rollbox.server.local import LocalServer

TEMPLATE = Path(__file__).with_name("repl.yaml")
BUGGY = """\
def total(qty, unit, member):
    cost = qty * unit
    if qty > 10:
        cost = cost * 90 // 100
    if member:
        cost = cost - 50
    return cost
"""
SESSION = '''
import json, math, os, random, secrets, time
from fractions import Fraction
started = time.perf_counter()

def reference(qty, unit, member):  # the spec as written, in exact arithmetic: 10% off from 10 items, members
    cost = Fraction(qty * unit)    # 500 cents off, never below 0 (slow but plainly right: run once, here)
    if qty >= 10:
        cost *= 1 - Fraction(10, 100)
    if member:
        cost -= 500
    return max(math.floor(cost), 0)

rng = random.Random(0)
cases = []
for _ in range(CASES):
    qty, unit, member = rng.randint(1, 20), rng.randint(1, 200), rng.random() < 0.5
    cases.append((qty, unit, member, reference(qty, unit, member)))
token = secrets.token_hex(4)  # random, made once: a REPL that shows it holds this session's memory
src, edits = BUGGY, []
setup_s = time.perf_counter() - started

def edit(old, new):
    global src
    assert old in src, old
    src = src.replace(old, new, 1)
    edits.append(new)

def report():
    try:
        namespace = {}
        exec(src, namespace)
        passed = sum(namespace["total"](qty, unit, member) == expected for qty, unit, member, expected in cases)
    except Exception:  # an edit that breaks total() fails the tests
        passed = 0
    return {"passed": passed, "cases": len(cases), "token": token, "pid": os.getpid(), "edits": edits,
            "setup_s": setup_s, "src": src}
'''
EDITS = {  # the candidate next statements: name -> (old text, new text) of total()'s source
    "bulk from 10": ("qty > 10", "qty >= 10"),
    "member 500": ("cost - 50\n", "cost - 500\n"),
    "never negative": ("return cost", "return max(cost, 0)"),
    "9 // 10": ("cost * 90 // 100", "cost * 9 // 10"),  # the same result: changes nothing
    "not member": ("if member:", "if not member:"),
    "in cents": ("qty * unit", "qty * unit * 100"),
}
MARK = "@@ "
"""Starts the line on which the REPL answers a statement (report()'s JSON)."""


class Repl:
    """The REPL (`python3 -i`) running in one sandbox, as a background process: statements go to its stdin, answers
    are read from its output from where the last one ended."""

    def __init__(self, process: ProcessHandle, offset: int = 0) -> None:
        self.process = process
        self.offset = offset

    def forked(self, child: Sandbox) -> Repl:
        """The same REPL in a forked child: the process, with its id and output, is there as in the parent."""
        return Repl(child.commands.connect(self.process.id), self.offset)

    def send(self, statement: str) -> float:
        """Sends one statement (one line) and asks for report() after it; returns when it was sent."""
        self.process.send_stdin(f"{statement}\nprint({MARK!r} + json.dumps(report()))\n")
        return time.perf_counter()

    def answer(self) -> dict:
        """Reads the REPL's output from where the last answer ended up to report()'s line, then closes the stream
        (a fork fails while one is open: README.md)."""
        stdout, stderr = "", ""
        events = self.process.events(self.offset)
        try:
            for event in events:
                if event.type == "stderr":
                    stderr += event.data
                elif event.type == "stdout":
                    stdout += event.data
                    lines = [line for line in stdout.split("\n")[:-1] if line.startswith(MARK)]
                    if lines:
                        self.offset = event.offset
                        return json.loads(lines[0][len(MARK):])
                elif event.type == "end":
                    raise RuntimeError(f"the REPL ended: {event.result}\n{stderr[-2000:]}")
        finally:
            events.close()
        raise RuntimeError("the REPL's output stream ended")


@dataclass
class Node:
    sandbox: Sandbox
    repl: Repl
    path: list[str] = field(default_factory=list)
    answer: dict = field(default_factory=dict)

    @property
    def score(self) -> float:
        return self.answer["passed"] / self.answer["cases"]


def expand(node: Node, token: str) -> list[Node]:
    """Forks the node's sandbox once per edit not yet on its path and scores each child by its REPL's answer."""
    moves = [name for name in EDITS if name not in node.path]
    started = time.perf_counter()
    boxes = node.sandbox.fork(len(moves))  # each child runs the parent's REPL, memory and all
    fork_s = time.perf_counter() - started
    print(f"\nforked {node.sandbox.id} ({node.score:.1%}, path {node.path}) {len(moves)} ways in {fork_s:.2f} s")
    kids = [Node(box, node.repl.forked(box), [*node.path, move]) for box, move in zip(boxes, moves, strict=True)]
    sent = [kid.repl.send(f"edit{EDITS[kid.path[-1]]!r}") for kid in kids]  # every child's REPL works at once
    for kid, at in zip(kids, sent, strict=True):
        kid.answer = kid.repl.answer()
        took = time.perf_counter() - at
        held = (kid.answer["token"] == token and kid.answer["pid"] == node.answer["pid"]
                and kid.answer["edits"] == [*node.answer["edits"], EDITS[kid.path[-1]][1]])
        print(f"  {kid.path[-1]:<15} {kid.score:7.1%}  answered in {took:.2f} s; held the parent's state: "
              f"{'yes' if held else 'NO'} (pid {kid.answer['pid']}, token {kid.answer['token']}, "
              f"{kid.answer['cases']} cases, {len(kid.answer['edits']) - 1} earlier edits)")
    return kids


def search(client: SandboxClient, cases: int, beam: int) -> Node:
    """Beam search: expands every node of the beam, keeps the `beam` best children and deletes the rest."""
    client.apply(str(TEMPLATE))
    live: dict[str, Sandbox] = {}  # every sandbox of the tree not yet deleted
    try:
        started = time.perf_counter()
        box = client.create_sandbox(template="python-repl")
        live[box.id] = box
        process = box.commands.run(["python3", "-i", "-q", "-u"], background=True)
        root = Node(box, Repl(process))
        root.repl.send(f"BUGGY = {BUGGY!r}; CASES = {cases}; exec({SESSION!r})")
        root.answer = root.repl.answer()
        build_s, token = time.perf_counter() - started, root.answer["token"]
        print(f"claimed sandbox {box.id} (gVisor) and started a REPL, `python3 -i`, in it as process {process.id} "
              f"(pid {process.pid})\nthe REPL built {root.answer['cases']} test cases in "
              f"{root.answer['setup_s']:.2f} s (session token {token}); the buggy total() passes {root.score:.1%}")
        frontier, forks, made, fork_s = [root], 0, 0, 0.0
        while frontier[0].score < 1 and len(frontier[0].path) < len(EDITS):
            children = []
            for node in frontier:
                started = time.perf_counter()
                kids = expand(node, token)
                fork_s, forks, made = fork_s + time.perf_counter() - started, forks + 1, made + len(kids)
                live.update((kid.sandbox.id, kid.sandbox) for kid in kids)
                live.pop(node.sandbox.id).delete()  # fully expanded: its children carry all of it
                children += kids
            children.sort(key=lambda kid: kid.score, reverse=True)
            frontier = children[:beam]
            for kid in children[beam:]:
                live.pop(kid.sandbox.id).delete()
            print("  kept: " + ", ".join(f"{' -> '.join(kid.path)} ({kid.score:.1%})" for kid in frontier))
        best = frontier[0]
        print(f"\nbest path: {' -> '.join(best.path)}: {best.score:.1%} of {best.answer['cases']} tests pass "
              f"({'goal reached' if best.score == 1 else 'goal not reached'})\n{best.answer['src']}")
        print(f"{made} children from {forks} forks, forked and scored in {fork_s:.1f} s ({fork_s / max(made, 1):.2f} s "
              f"a child); without live fork each child would first rebuild the session, {build_s:.2f} s here "
              "(claim, start the REPL, build the tests), then replay its path")
        return best
    finally:
        for box in live.values():
            with contextlib.suppress(Exception):
                box.delete()


@contextlib.contextmanager
def server(url: str | None, data_dir: Path) -> Iterator[str]:
    if url:
        yield url
        return
    with LocalServer(data_dir) as local:
        print(f"embedded server at {local.url} (data in {data_dir})")
        yield local.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a rollbox router (default: start an embedded server)")
    parser.add_argument("--token", help="a tenant token for --url")
    parser.add_argument("--data-dir", type=Path, default=Path("/var/lib/rollbox-tree-search"),
                        help="the embedded server's data (%(default)s)")
    parser.add_argument("--cases", type=int, default=300_000, help="test cases the REPL builds (%(default)s)")
    parser.add_argument("--beam", type=int, default=2, help="children kept at each depth (%(default)s)")
    args = parser.parse_args(argv)
    with server(args.url, args.data_dir) as url, SandboxClient(url, args.token) as client:
        best = search(client, args.cases, args.beam)
    return 0 if best.score == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
