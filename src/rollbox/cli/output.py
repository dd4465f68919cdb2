"""How the commands speak: results on stdout, progress and errors on stderr, resources as tables, JSON or YAML."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import yaml
from pydantic import BaseModel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollbox._console import make_console
from rollbox.client import ApplyEvent

out = make_console()
err = make_console(stderr=True)


def progress() -> Progress:
    """One line per resource with a bar, on a terminal; nothing otherwise (the summary lines tell)."""
    return Progress(SpinnerColumn(), TextColumn("{task.fields[resource]}"), BarColumn(),
                    TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True,
                    disable=not err.is_terminal)


def label(event: ApplyEvent) -> str:
    return f"{(event.kind or '').removeprefix('Sandbox').lower()}/{event.name}"


class ApplyProgress:
    """Build progress of each resource while `apply` runs."""

    def __init__(self) -> None:
        self.progress = progress()
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> ApplyProgress:
        self.progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.progress.stop()

    def update(self, event: ApplyEvent) -> None:
        if event.name is None:
            return
        name = label(event)
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task("", total=None, resource=name)
        task = self.tasks[name]
        if event.event == "applied":
            self.progress.update(task, total=1, completed=1, description=str(event.status))
        elif event.event == "error":
            self.progress.update(task, total=1, completed=0, description=f"failed: {event.message}")
        else:
            self.progress.update(task, description=event.message or "")


def show(kind: str, items: list[BaseModel], output: str) -> None:
    """Prints `items` of `kind` (templates, warmpools, sandboxes, snapshots, volumes or processes) as a table, JSON
    or YAML."""
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
    "processes": (["ID", "PID", "STATE", "TAG", "AGE", "COMMAND"], lambda p: [
        p.id, str(p.pid), _process_state(p), p.tag or "-", _age(p.started_at), " ".join(p.command)]),
    "images": (["NAME", "DIGEST", "LAYERS", "SIZE", "SHARED", "USED"], lambda i: [
        ", ".join(i.names), i.digest[:19], str(i.layers), _size(i.size), _size(i.shared), _age(i.used_at)]),
    "volumes": (["NAME", "SIZE", "USED", "MOUNTED BY", "AGE"], lambda v: [
        v.name, _size(v.size), _size(v.used),
        ", ".join(f"{use.sandbox}{' (ro)' if use.read_only else ''}" for use in v.mounted_by) or "-",
        _age(v.created_at)]),
}


def _process_state(process: Any) -> str:
    """`running`, `exited 0`, `killed (9)`, `timed out`."""
    if process.running:
        return "running"
    if process.timed_out:
        return "timed out"
    return f"killed ({process.signal})" if process.signal else f"exited {process.exit_code}"


def _size(count: int) -> str:
    """`512Mi`, `1.5Gi`: bytes in binary units, as sizes are written in templates."""
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return str(count)
