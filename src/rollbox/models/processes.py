"""The wire shapes of background processes, terminals and shell sessions (docs/processes.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema

from rollbox.models.sandboxes import MAX_EXEC_TIMEOUT, MAX_PATH, ExecResult, Request

MAX_PROCESS_TAG = 256
"""The longest tag a process may carry."""


def _signal_number(value: Any) -> Any:
    """A signal by number or by name (`"SIGTERM"`, `"term"`, `15`)."""
    if isinstance(value, str) and not value.isdigit():
        import signal as signals

        name = value.upper() if value.upper().startswith("SIG") else "SIG" + value.upper()
        found = getattr(signals.Signals, name, None)
        if found is None:
            raise ValueError(f"{value!r} is not a signal: use a number or a name such as SIGTERM")
        return int(found)
    return value


Signal = Annotated[int, BeforeValidator(_signal_number), Field(ge=1, le=64), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 64}, {"type": "string", "pattern": "^[A-Za-z0-9]+$"}]})]
"""A signal by number, or by name (`SIGTERM`, `term`); the schema says so in JSON Schema's words."""


class PtySize(BaseModel):
    """A terminal's size in character cells."""

    rows: int = Field(24, ge=1, le=1000)
    cols: int = Field(80, ge=1, le=1000)


class ProcessRequest(Request):
    """Starts a process that runs in the background: `POST /v1/sandboxes/{sandbox_id}/processes`.

    It keeps running between calls until it ends, is killed, or its sandbox is reset or deleted. Its output
    is kept in the sandbox (the last `output_limit` bytes of stdout and stderr together) to be read back or
    streamed again.
    """

    command: str | list[str]
    """A string runs under `/bin/sh -c`; a list is the argv."""
    env: dict[str, str] | None = None
    cwd: str | None = Field(None, max_length=MAX_PATH)
    user: str | None = None
    stdin: str | None = None
    """Written to the process's stdin as it starts; more can be sent later unless `close_stdin`."""
    close_stdin: bool = False
    """Close stdin after `stdin` (a process that reads it to the end then sees end of file)."""
    pty: PtySize | None = None
    """Run on a terminal of this size instead of pipes: stdout and stderr arrive together as stdout."""
    timeout: float | None = Field(None, gt=0, le=MAX_EXEC_TIMEOUT)
    """Seconds after which the process and everything it started are killed."""
    output_limit: int | None = Field(None, gt=0)
    """Bytes of each stream kept for reading back (the template's output limit by default)."""
    tag: str | None = Field(None, max_length=MAX_PROCESS_TAG)
    """A caller's name for the process, shown in lists."""


class ProcessControl(Request):
    """What `POST .../processes/{process_id}/control` does, in this order: write stdin, close it, resize the
    terminal, send a signal. Each field is optional."""

    stdin: str | None = None
    close_stdin: bool = False
    resize: PtySize | None = None
    signal: Signal | None = None


class ShellRequest(Request):
    """Starts a persistent shell session: `POST /v1/sandboxes/{sandbox_id}/shells`. Its working directory,
    environment and shell variables carry from one command to the next."""

    env: dict[str, str] | None = None
    cwd: str | None = Field(None, max_length=MAX_PATH)
    user: str | None = None
    shell: str | None = None
    """The shell to run: bash when the sandbox has it, else /bin/sh."""


class ShellCommand(Request):
    """One command run in a shell session: `POST /v1/sandboxes/{sandbox_id}/shells/{process_id}/run`."""

    command: str
    timeout: float | None = Field(None, gt=0, le=MAX_EXEC_TIMEOUT)
    """Seconds after which the command is interrupted (then killed); the session lives on."""
    output_limit: int | None = Field(None, gt=0)


class ProcessInfo(BaseModel):
    """A background process of a sandbox (running, or ended and kept to be read back)."""

    id: str
    """The process id rollbox gives it: unique in its sandbox, never reused."""
    pid: int
    """Its pid inside the sandbox."""
    command: list[str]
    cwd: str | None = None
    tag: str | None = None
    pty: bool = False
    shell: bool = False
    """A shell session (run commands in it with `.../shells/{id}/run`)."""
    running: bool = True
    exit_code: int | None = None
    """None while running or when it timed out; 128 + the signal's number when a signal ended it (`signal`)."""
    signal: int = 0
    timed_out: bool = False
    started_at: float = 0.0


class ProcessEvent(BaseModel):
    """One line of a process's event stream (`GET .../processes/{process_id}/events`).

    `start` comes first, with the byte offset its output resumes from; `stdout` and `stderr` carry output,
    each with the offset just past it (stream again from there after a reconnect); `gap` says output was
    dropped (the reader fell behind the kept output) and where it resumes; `end` carries the result (exit
    code, signal, timed_out; its stdout and stderr are empty: they were streamed); `error` ends a stream
    that failed.
    """

    type: Literal["start", "stdout", "stderr", "gap", "end", "error"]
    data: str = ""
    offset: int | None = None
    pid: int | None = None
    result: ExecResult | None = None
    code: str | None = None
    message: str | None = None
