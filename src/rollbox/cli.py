"""The `rollbox` command: run the router, apply resources, look at them, drive sandboxes.

Everything but `serve` and `demo` goes through the SDK, so what works here works in a trainer.
Errors print one line and exit non-zero; tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollbox import errors
from rollbox.client import ApplyEvent, Sandbox, SandboxClient
from rollbox.client._http import DEFAULT_URL
from rollbox.engine import DEFAULT_DATA_DIR, Engine
from rollbox.node import LocalNode

BENCH = Path(__file__).resolve().parents[2] / "bench" / "server.py"
KINDS = {
    "template": "templates", "templates": "templates",
    "warmpool": "warmpools", "warmpools": "warmpools", "pool": "warmpools", "pools": "warmpools",
    "sandbox": "sandboxes", "sandboxes": "sandboxes",
    "snapshot": "snapshots", "snapshots": "snapshots",
}
"""Every spelling `get` and `delete` accept, and the kind each one means."""
SINGULAR = {"templates": "template", "warmpools": "warmpool", "sandboxes": "sandbox", "snapshots": "snapshot"}

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class UsageError(Exception):
    """A mistake on the command line that argparse cannot see."""


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        code = args.run(args)
    except (errors.RollboxError, UsageError, OSError) as error:
        err.print(f"rollbox: {error}", markup=False, soft_wrap=True)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code or 0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollbox", description="Isolated, stateful sandboxes for RL of code agents.")
    commands = parser.add_subparsers(metavar="COMMAND", required=True)
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--url", default=os.environ.get("ROLLBOX_URL", DEFAULT_URL),
                        help="the router's address, http://HOST:PORT or unix:///PATH "
                             "(env ROLLBOX_URL; default %(default)s)")
    remote.add_argument("--token", default=os.environ.get("ROLLBOX_TOKEN"), help="bearer token (env ROLLBOX_TOKEN)")

    serve = commands.add_parser("serve", help="run the router and this machine's node")
    serve.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="templates, layers and state (%(default)s)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (%(default)s)")
    serve.add_argument("--socket", type=Path, metavar="PATH",
                       help="listen on this unix socket (mode 0600: your user only) instead of --host and --port; "
                            "clients use --url unix://PATH")
    serve.add_argument("--token", action="append", default=[], metavar="TENANT=TOKEN",
                       help="accept TOKEN as TENANT (repeatable); with none the server is open, on loopback only")
    serve.add_argument("--tokens-file", type=Path, metavar="FILE",
                       help="TENANT=TOKEN lines ('#' comments): tokens kept out of the process list")
    serve.add_argument("--admin", action="append", default=[], metavar="TENANT",
                       help="let TENANT apply and delete templates and warm pools (repeatable; open server: anyone)")
    serve.add_argument("--max-sandboxes", type=int, help="sandboxes this node runs at most")
    serve.set_defaults(run=cmd_serve)

    apply = commands.add_parser("apply", parents=[remote], help="create or update templates and warm pools")
    apply.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                       help="YAML file with one or more resources ('-' reads stdin; repeatable)")
    apply.add_argument("--wait", action="store_true", help="then wait until every warm pool applied is full")
    apply.set_defaults(run=cmd_apply)

    get = commands.add_parser("get", parents=[remote], help="list templates, warmpools, sandboxes or snapshots")
    get.add_argument("kind", metavar="KIND", help="templates, warmpools, sandboxes or snapshots")
    get.add_argument("name", nargs="?", metavar="NAME", help="show only this one")
    get.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    get.set_defaults(run=cmd_get)

    delete = commands.add_parser("delete", parents=[remote], help="delete templates, warmpools, sandboxes or snapshots")
    delete.add_argument("kind", metavar="KIND", help="template, warmpool, sandbox or snapshot")
    delete.add_argument("names", nargs="+", metavar="NAME")
    delete.set_defaults(run=cmd_delete)

    ls = commands.add_parser("ls", parents=[remote], help="list sandboxes")
    ls.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    ls.set_defaults(run=cmd_ls)

    exec_ = commands.add_parser(
        "exec", parents=[remote], help="run a command in a sandbox",
        description="Runs a command in a sandbox, streaming its output, and exits with its exit code (124 on timeout). "
                    "One argument runs under /bin/sh -c; several are the argv.",
    )
    exec_.add_argument("sandbox", metavar="SANDBOX", help="the sandbox's id")
    exec_.add_argument("command", nargs="+", metavar="CMD", help="after --: the command and its arguments")
    exec_.add_argument("--timeout", type=float, help="seconds before the command is killed")
    exec_.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE")
    exec_.add_argument("-w", "--cwd", help="working directory inside the sandbox")
    exec_.add_argument("-u", "--user", help="user to run as (the template's by default)")
    exec_.add_argument("-i", "--stdin", action="store_true", help="send this command's stdin to the command")
    exec_.set_defaults(run=cmd_exec)

    bench = commands.add_parser("bench", parents=[remote], help="benchmark a running server (bench/server.py)")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed on to bench/server.py")
    bench.set_defaults(run=cmd_bench)

    demo = commands.add_parser("demo", help="build an example template, start a sandbox, run a command in it")
    demo.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="templates, layers and state (%(default)s)")
    demo.set_defaults(run=cmd_demo)
    return parser


def _client(args: argparse.Namespace) -> SandboxClient:
    return SandboxClient(args.url, args.token)


def _pairs(items: list[str], form: str) -> dict[str, str]:
    return dict(_pair(item, form, repr(item)) for item in items)


def _pair(item: str, form: str, where: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UsageError(f"{where}: write it as {form}")
    return key, value


# -- serve ------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> None:
    from rollbox.server import serve

    limits = {} if args.max_sandboxes is None else {"max_sandboxes": args.max_sandboxes}
    tokens = {**_pairs(args.token, "TENANT=TOKEN"), **_tokens_file(args.tokens_file)}
    serve(data_dir=args.data_dir, host=args.host, port=args.port, socket=args.socket, tokens=tokens,
          admins=args.admin, **limits)


def _tokens_file(path: Path | None) -> dict[str, str]:
    """TENANT=TOKEN lines; a mistake is reported by line number, never by echoing what might be a token."""
    if path is None:
        return {}
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise UsageError(f"cannot read the tokens file {path}: {error.strerror}") from None
    tokens = {}
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            tenant, token = _pair(line.strip(), "TENANT=TOKEN", f"{path}, line {number}")
            tokens[tenant.strip()] = token.strip()
    return tokens


# -- apply ------------------------------------------------------------------------------------


def cmd_apply(args: argparse.Namespace) -> None:
    client = _client(args)
    for filename in args.filename:
        source = sys.stdin.read() + "\n" if filename == "-" else Path(filename)
        with _ApplyProgress() as progress:
            applied = client.apply(source, on_progress=progress.update)
        for event in applied:
            out.print(f"{_label(event)} {event.status}")
        if args.wait:
            _fill(client, [event.name for event in applied if event.kind == "SandboxWarmPool" and event.name])


def _label(event: ApplyEvent) -> str:
    return f"{(event.kind or '').removeprefix('Sandbox').lower()}/{event.name}"


def _progress() -> Progress:
    """One line per resource with a bar, on a terminal; nothing otherwise (the summary lines tell)."""
    return Progress(SpinnerColumn(), TextColumn("{task.fields[resource]}"), BarColumn(),
                    TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True,
                    disable=not err.is_terminal)


def _fill(client: SandboxClient, pools: list[str]) -> None:
    """Waits until each pool has all its replicas ready, with a bar per pool."""
    with _progress() as progress:
        tasks = {name: progress.add_task("", total=None, resource=f"warmpool/{name}") for name in pools}
        waiting = sorted(pools)
        while True:
            for name in list(waiting):
                pool = client.get_warmpool(name)
                progress.update(tasks[name], total=pool.replicas, completed=pool.ready,
                                description=f"{pool.ready}/{pool.replicas} ready")
                if pool.ready >= pool.replicas:
                    waiting.remove(name)
                    out.print(f"warmpool/{name} full")
            if not waiting:
                return
            time.sleep(0.2)


class _ApplyProgress:
    """Build progress of each resource while `apply` runs."""

    def __init__(self) -> None:
        self.progress = _progress()
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> _ApplyProgress:
        self.progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.progress.stop()

    def update(self, event: ApplyEvent) -> None:
        if event.name is None:
            return
        label = _label(event)
        if label not in self.tasks:
            self.tasks[label] = self.progress.add_task("", total=None, resource=label)
        task = self.tasks[label]
        if event.event == "applied":
            self.progress.update(task, total=1, completed=1, description=str(event.status))
        elif event.event == "error":
            self.progress.update(task, total=1, completed=0, description=f"failed: {event.message}")
        else:
            self.progress.update(task, description=event.message or "")


# -- get, delete, ls --------------------------------------------------------------------------


def _kind(name: str) -> str:
    try:
        return KINDS[name.lower()]
    except KeyError:
        raise UsageError(f"{name!r} is not a kind: use templates, warmpools, sandboxes or snapshots") from None


def cmd_get(args: argparse.Namespace) -> None:
    client = _client(args)
    kind = _kind(args.kind)
    items = _one(client, kind, args.name) if args.name else _all(client, kind)
    _show(kind, items, args.output)


def cmd_ls(args: argparse.Namespace) -> None:
    _show("sandboxes", _all(_client(args), "sandboxes"), args.output)


def _all(client: SandboxClient, kind: str) -> list[BaseModel]:
    listing: dict[str, Callable[[], Sequence[BaseModel]]] = {
        "templates": client.list_templates,
        "warmpools": client.list_warmpools,
        "sandboxes": lambda: [sandbox.info for sandbox in client.list_sandboxes()],
        "snapshots": client.list_snapshots,
    }
    return list(listing[kind]())


def _one(client: SandboxClient, kind: str, name: str) -> list[BaseModel]:
    if kind == "templates":
        return [client.get_template(name)]
    if kind == "warmpools":
        return [client.get_warmpool(name)]
    if kind == "sandboxes":
        return [client.get_sandbox(name).info]
    found = [snapshot for snapshot in client.list_snapshots() if snapshot.name == name]
    if not found:
        raise errors.SnapshotNotFound(f"snapshot {name!r} does not exist: `rollbox get snapshots` lists them")
    return list(found)


def _show(kind: str, items: list[BaseModel], output: str) -> None:
    if output != "table":
        data = [item.model_dump(mode="json") for item in items]
        text = json.dumps(data, indent=2) if output == "json" else yaml.safe_dump(data, sort_keys=False)
        out.print(text, markup=False, soft_wrap=True)
        return
    columns, row = _COLUMNS[kind]
    table = Table(*columns, box=None, header_style="bold", pad_edge=False)
    for item in items:
        table.add_row(*row(item))
    out.print(table)


def _age(moment: float | None) -> str:
    """`42s`, `5m`, `3h`, `2d` ago (or from now, for expiry times); `-` for none."""
    if moment is None:
        return "-"
    seconds = abs(time.time() - moment)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


_COLUMNS: dict[str, tuple[list[str], Callable[[Any], list[str]]]] = {
    "templates": (["NAME", "BASE", "RUNTIME", "STEPS", "AGE"], lambda t: [
        t.name, t.spec.get("base", "-"), t.spec.get("runtime", "-"), str(len(t.spec.get("steps", []))),
        _age(t.built_at)]),
    "warmpools": (["NAME", "TEMPLATE", "READY", "STARTING"], lambda p: [
        p.name, p.template, f"{p.ready}/{p.target}", str(p.starting)]),
    "sandboxes": (["ID", "TEMPLATE", "WARMPOOL", "STATE", "AGE", "EXPIRES IN", "PARENT"], lambda s: [
        s.id, s.template, s.warmpool or "-", s.state, _age(s.created_at), _age(s.expires_at), s.parent or "-"]),
    "snapshots": (["NAME", "TEMPLATE", "SOURCE", "AGE"], lambda s: [
        s.name, s.template, s.source or "-", _age(s.created_at)]),
}


def cmd_delete(args: argparse.Namespace) -> None:
    client = _client(args)
    kind = _kind(args.kind)
    delete: Callable[[str], None] = {
        "templates": client.delete_template,
        "warmpools": client.delete_warmpool,
        "sandboxes": client.delete_sandbox,
        "snapshots": client.delete_snapshot,
    }[kind]
    for name in args.names:
        delete(name)
        out.print(f"{SINGULAR[kind]}/{name} deleted")


# -- exec -------------------------------------------------------------------------------------


def cmd_exec(args: argparse.Namespace) -> int:
    env = _pairs(args.env, "KEY=VALUE") or None
    command: str | list[str] = args.command[0] if len(args.command) == 1 else args.command
    sandbox = _client(args).get_sandbox(args.sandbox)
    result = sandbox.commands.run(
        command, timeout=args.timeout, env=env, cwd=args.cwd, user=args.user,
        stdin=sys.stdin.read() if args.stdin else None, on_stdout=_writer(sys.stdout), on_stderr=_writer(sys.stderr),
    )
    if result.timed_out:
        err.print(f"rollbox: the command timed out after {args.timeout:g}s and was killed", markup=False)
        return 124
    if result.exit_code is None:
        return 128 + result.signal
    return result.exit_code


def _writer(stream: Any) -> Callable[[str], None]:
    def write(data: str) -> None:
        stream.write(data)
        stream.flush()

    return write


# -- bench and demo ---------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    """A thin hook: the benchmark lives in the source checkout and reads ROLLBOX_URL like any SDK user."""
    if not BENCH.exists():
        raise UsageError(f"{BENCH} is not there: the server benchmark comes with the source checkout")
    env = {**os.environ, "ROLLBOX_URL": args.url}
    if args.token:
        env["ROLLBOX_TOKEN"] = args.token
    passed = args.args[1:] if args.args[:1] == ["--"] else args.args
    return subprocess.call([sys.executable, str(BENCH), *passed], env=env)


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


def cmd_demo(args: argparse.Namespace) -> None:
    """One episode in miniature, through the SDK and an embedded server: build, claim, run, fix, fork, reset."""
    from rollbox.server import create_app
    from rollbox.server.threaded import ThreadServer

    with Engine(args.data_dir) as engine:
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

    with _ApplyProgress() as progress:
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
