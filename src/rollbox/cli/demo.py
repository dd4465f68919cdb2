"""`demo`: one episode in miniature, through the SDK and a router served from this process: build, claim, run,
fix, fork, reset."""

from __future__ import annotations

import argparse
import time

from rollbox.cli.arguments import Commands, data_dir_options
from rollbox.cli.output import ApplyProgress, out
from rollbox.client import Sandbox, SandboxClient

DEMO_TEMPLATE = """\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata:
  name: rollbox-demo
spec:
  steps:
    - workdir: /opt/demo
    - user: user
    - run: |
        cat > calc.py <<'END'
        def add(a, b):
            return a - b
        END
        cat > check.py <<'END'
        from calc import add
        assert add(2, 3) == 5, f"add(2, 3) gave {add(2, 3)}, not 5"
        print("checks pass")
        END
"""
DEMO_FIX = "def add(a, b):\n    return a + b\n"


def add_command(commands: Commands) -> None:
    demo = commands.add_parser("demo", parents=[data_dir_options()],
                               help="build an example template, start a sandbox, run a command in it")
    demo.set_defaults(run=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> None:
    """The router runs in a thread of this process, over an engine of its own: the demo deletes only the sandboxes
    it made, never those another server left on the data directory."""
    from rollbox.engine import DEFAULT_DATA_DIR, Engine
    from rollbox.node import LocalNode
    from rollbox.server import create_app
    from rollbox.server.threaded import ThreadServer

    with Engine(args.data_dir or DEFAULT_DATA_DIR) as engine:
        node = LocalNode(engine)
        try:
            with ThreadServer(create_app(node)) as server, SandboxClient(server.url) as client:
                _demo(client)
        finally:
            node.close()


def _demo(client: SandboxClient) -> None:
    steps = _Steps()

    def check(sandbox: Sandbox) -> str:
        result = sandbox.commands.run(["python3", "check.py"], timeout=30)
        outcome = result.stdout.strip() if result.ok else result.stderr.strip().splitlines()[-1]
        return f"python3 check.py: exit {result.exit_code}, {outcome}"

    with ApplyProgress() as progress:
        client.apply(DEMO_TEMPLATE, on_progress=progress.update)
    steps.done("template rollbox-demo built (cached after the first run)")
    with client.create_sandbox(template="rollbox-demo") as sandbox:
        steps.done(f"sandbox {sandbox.id} started")
        steps.done(check(sandbox))
        sandbox.files.write("calc.py", DEMO_FIX)
        steps.done("calc.py fixed through the files API")
        steps.done(check(sandbox))
        children = sandbox.fork(2)
        steps.done(f"forked into {' and '.join(child.id for child in children)}")
        for child in children:
            with child:
                steps.done(f"{child.id}: {check(child)}")
        sandbox.reset()
        steps.done("reset to the template's baseline")
        steps.done(check(sandbox))
    steps.done("every sandbox deleted")


class _Steps:
    """Prints each finished step with the time it took."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def done(self, what: str) -> None:
        now = time.perf_counter()
        out.print(f"[green]✓[/] {what} [dim]({(now - self.started) * 1000:.0f} ms)[/]", soft_wrap=True)
        self.started = now
