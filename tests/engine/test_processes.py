"""Background processes, terminals and shell sessions through the exec agent, under runc and gVisor."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from rollbox.engine import Container
from rollbox.errors import ProcessNotFound
from rollbox.models import ProcessControl, ProcessEvent, ProcessRequest, PtySize, ShellCommand

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


async def collect(sandbox: Container, process_id: str, offset: int | None = 0) -> list[ProcessEvent]:
    return [event async for event in sandbox.engine.processes(sandbox.id).events(process_id, offset)]


def output(events: list[ProcessEvent], kind: str = "stdout") -> str:
    return "".join(event.data for event in events if event.type == kind)


def test_a_process_outlives_its_connection(sandbox: Container) -> None:
    async def main() -> None:
        processes = sandbox.engine.processes(sandbox.id)
        info = await processes.start(ProcessRequest(command="echo out; echo err >&2; read line; echo got $line"))
        assert info.running and info.command == ["/bin/sh", "-c", "echo out; echo err >&2; read line; echo got $line"]
        assert sandbox.exec("true").ok
        await processes.control(info.id, ProcessControl(stdin="hi\n"))
        events = await collect(sandbox, info.id)
        assert (events[0].type, events[-1].type) == ("start", "end")
        assert (output(events), output(events, "stderr")) == ("out\ngot hi\n", "err\n")
        assert events[-1].result is not None and events[-1].result.exit_code == 0
        replay = await collect(sandbox, info.id, offset=4)  # from a reconnect, past "out\n"
        assert (replay[0].offset, output(replay), output(replay, "stderr")) == (4, "got hi\n", "err\n")
        ended = await processes.get(info.id)
        assert (ended.running, ended.exit_code) == (False, 0)

    run(main())


def test_a_missing_command_ends_at_once(sandbox: Container) -> None:
    async def main() -> None:
        processes = sandbox.engine.processes(sandbox.id)
        info = await processes.start(ProcessRequest(command=["/no/such/binary"]))
        events = await collect(sandbox, info.id)
        assert events[-1].result is not None and events[-1].result.exit_code == 127
        assert "/no/such/binary" in output(events, "stderr")

    run(main())


def test_signals_and_forgetting(sandbox: Container) -> None:
    async def main() -> None:
        processes = sandbox.engine.processes(sandbox.id)
        info = await processes.start(ProcessRequest(command="sleep 100 & sleep 100"))
        await processes.control(info.id, ProcessControl(signal="SIGTERM"))
        events = await collect(sandbox, info.id)
        assert events[-1].result is not None and events[-1].result.signal == 15
        await processes.delete(info.id)
        assert await processes.list() == []
        with pytest.raises(ProcessNotFound):
            await processes.control(info.id, ProcessControl(signal=9))

    run(main())


def test_terminal_size_and_echo(sandbox: Container) -> None:
    async def main() -> None:
        processes = sandbox.engine.processes(sandbox.id)
        info = await processes.start(ProcessRequest(command="stty size; read line; echo line=$line",
                                                    pty=PtySize(rows=33, cols=99)))
        await processes.control(info.id, ProcessControl(stdin="typed\r"))
        text = output(await collect(sandbox, info.id))
        assert "33 99" in text and "typed\r\n" in text and "line=typed" in text

    run(main())


def test_shell_session(sandbox: Container) -> None:
    async def main() -> None:
        processes = sandbox.engine.processes(sandbox.id)
        shell = await processes.start_shell(env=None, cwd="/tmp", user=None, shell=None)
        assert (await processes.run_in_shell(shell.id, ShellCommand(command="cd /opt/data; X=1"))).ok
        result = await processes.run_in_shell(shell.id, ShellCommand(command="sleep 60", timeout=0.3))
        assert result.timed_out
        result = await processes.run_in_shell(shell.id, ShellCommand(command="pwd; echo $X; cat file"))
        assert result.stdout == "/opt/data\n1\nbaseline\n"

    run(main())


def test_a_follower_that_falls_behind_skips_ahead(sandbox: Container) -> None:
    async def main() -> None:
        processes = sandbox.engine.processes(sandbox.id)
        info = await processes.start(ProcessRequest(command="echo ready; read go; head -c 20000000 /dev/zero; echo end",
                                                    output_limit=100_000))
        stream = processes.events(info.id, 0)
        assert (await anext(stream)).offset == 0
        assert (await anext(stream)).data == "ready\n"  # following from the first byte before the flood starts
        await processes.control(info.id, ProcessControl(stdin="go\n"))
        while (await processes.get(info.id)).running:  # the process never waits for its reader
            await asyncio.sleep(0.05)
        events = [event async for event in stream]
        assert any(event.type == "gap" for event in events)
        assert sum(len(event.data) for event in events) < 1_000_000  # what the host held, and the ring
        assert output(events).endswith("end\n")
        assert events[-1].result is not None and events[-1].result.stdout_truncated

    run(main())


def test_processes_die_with_a_reset(sandbox: Container) -> None:
    async def main() -> list[Any]:
        processes = sandbox.engine.processes(sandbox.id)
        await processes.start(ProcessRequest(command="sleep 100"))
        sandbox.reset()
        return await sandbox.engine.processes(sandbox.id).list()

    assert run(main()) == []


def test_a_foreground_timeout_spares_background_processes(sandbox: Container) -> None:
    """A timed-out command's process tree is killed, and nothing else (gVisor has no subreapers: the agent
    tells its own processes by their session)."""
    async def main() -> bool:
        processes = sandbox.engine.processes(sandbox.id)
        info = await processes.start(ProcessRequest(command="sleep 100"))
        assert sandbox.exec("sleep 100 & sleep 100", timeout=0.3).timed_out
        return (await processes.get(info.id)).running

    assert run(main())
