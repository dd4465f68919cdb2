"""SWE-ReX's runtime contract on rollbox sandboxes, driven through the real `swe-rex` package's request models
and exceptions the way SWE-agent drives a deployment: a bash session whose directory and variables persist,
one-off commands, files, a hung command interrupted, and the sandbox gone after `stop()`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

swerex = pytest.importorskip("swerex")

from swerex import exceptions as rex_errors  # noqa: E402
from swerex.runtime import abstract as rex  # noqa: E402

from rollbox import SandboxClient, errors  # noqa: E402
from rollbox.rl.adapters.swerex import RollboxDeployment, RollboxDeploymentConfig  # noqa: E402


def test_sessions_commands_files_and_stop(url: str, tmp_path: Path) -> None:
    deployment = RollboxDeploymentConfig(url=url, template="rl-python", warmpool="rl-python").get_deployment()
    with pytest.raises(rex_errors.DeploymentNotStartedError):
        _ = deployment.runtime

    async def episode() -> str:
        await deployment.start()
        assert await deployment.is_alive()
        runtime = deployment.runtime
        await runtime.create_session(rex.CreateBashSessionRequest())
        with pytest.raises(rex_errors.SessionExistsError):
            await runtime.create_session(rex.CreateBashSessionRequest())
        await runtime.run_in_session(rex.BashAction(command="cd /tmp && export GREETING=hi && mkdir -p work"))
        observation = await runtime.run_in_session(rex.BashAction(command="pwd; echo $GREETING; echo oops >&2"))
        assert observation.output == "/tmp\nhi\noops\n" and observation.exit_code == 0
        failed = await runtime.run_in_session(rex.BashAction(command="false", check="silent"))
        assert failed.exit_code == 1
        with pytest.raises(rex_errors.NonZeroExitCodeError, match="exit code 3"):
            await runtime.run_in_session(rex.BashAction(command="(exit 3)"))
        with pytest.raises(rex_errors.BashIncorrectSyntaxError):
            await runtime.run_in_session(rex.BashAction(command="if then fi"))
        with pytest.raises(rex_errors.SessionDoesNotExistError):
            await runtime.run_in_session(rex.BashAction(command="true", session="other"))

        # A second session has a directory of its own.
        await runtime.create_session(rex.CreateBashSessionRequest(session="other"))
        other = await runtime.run_in_session(rex.BashAction(command="cd /opt; pwd", session="other"))
        assert other.output == "/opt\n"
        assert (await runtime.run_in_session(rex.BashAction(command="pwd"))).output == "/tmp\n"
        await runtime.close_session(rex.CloseBashSessionRequest(session="other"))

        executed = await runtime.execute(rex.Command(command=["python3", "-c", "print(6 * 7)"]))
        assert (executed.stdout, executed.exit_code) == ("42\n", 0)
        shelled = await runtime.execute(rex.Command(command="echo $0 >&2; exit 4", shell=True,
                                                    merge_output_streams=True))
        assert (shelled.stdout, shelled.stderr, shelled.exit_code) == ("/bin/sh\n", "", 4)
        with pytest.raises(rex_errors.CommandTimeoutError):
            await runtime.execute(rex.Command(command=["sleep", "5"], timeout=0.5))

        await runtime.write_file(rex.WriteFileRequest(path="/tmp/work/notes.txt", content="héllo\n"))
        assert (await runtime.read_file(rex.ReadFileRequest(path="/tmp/work/notes.txt"))).content == "héllo\n"
        assert (await runtime.run_in_session(rex.BashAction(command="cat work/notes.txt"))).output == "héllo\n"
        with pytest.raises(FileNotFoundError):
            await runtime.read_file(rex.ReadFileRequest(path="/tmp/work/missing"))
        (tmp_path / "repo" / "pkg").mkdir(parents=True)
        (tmp_path / "repo" / "pkg" / "mod.py").write_text("X = 1\n")
        (tmp_path / "single.txt").write_text("one file\n")
        await runtime.upload(rex.UploadRequest(source_path=str(tmp_path / "repo"), target_path="/tmp/repo"))
        await runtime.upload(rex.UploadRequest(source_path=str(tmp_path / "single.txt"), target_path="/tmp/single.txt"))
        listing = await runtime.run_in_session(rex.BashAction(command="cat /tmp/repo/pkg/mod.py /tmp/single.txt"))
        assert listing.output == "X = 1\none file\n"
        sandbox_id = runtime.sandbox.id
        await deployment.stop()
        return sandbox_id

    sandbox_id = asyncio.run(episode())
    assert not asyncio.run(deployment.is_alive())
    with SandboxClient(url) as client, pytest.raises(errors.SandboxNotFound):
        client.get_sandbox(sandbox_id)


def test_hung_commands_are_interrupted(url: str) -> None:
    """SWE-agent's two ways: a timeout then an interrupt, and an interrupt sent while the command hangs."""
    deployment = RollboxDeployment(url=url, template="rl-python", warmpool="rl-python")

    async def episode() -> None:
        await deployment.start()
        runtime = deployment.runtime
        try:
            await runtime.create_session(rex.CreateBashSessionRequest())
            await runtime.run_in_session(rex.BashAction(command="cd /tmp; export KEPT=yes"))
            with pytest.raises(rex_errors.CommandTimeoutError):
                await runtime.run_in_session(rex.BashAction(command="sleep 600", timeout=0.5))
            assert (await runtime.run_in_session(rex.BashInterruptAction())).exit_code == 0

            hung = asyncio.ensure_future(runtime.run_in_session(
                rex.BashAction(command="echo started; sleep 600; echo never", check="silent")))
            await asyncio.sleep(1.0)
            assert not hung.done()
            interrupted = await runtime.run_in_session(rex.BashInterruptAction(timeout=5))
            assert interrupted.output == "started"
            observation = await asyncio.wait_for(hung, 5)
            assert observation.exit_code == 130 and "never" not in observation.output

            # The session lives on, with what it had.
            assert (await runtime.run_in_session(rex.BashAction(command="echo $PWD $KEPT"))).output == "/tmp yes\n"

            # A program that reads the terminal, driven as SWE-agent drives gdb or a REPL.
            prompt = await runtime.run_in_session(rex.BashAction(command="python3 -q -i", is_interactive_command=True,
                                                             expect=[">>> "], timeout=10))
            assert prompt.expect_string == ">>> "
            answer = await runtime.run_in_session(rex.BashAction(command="print(6 * 7)", is_interactive_command=True,
                                                             expect=[">>> "], timeout=10))
            assert answer.output == "42"
            await runtime.run_in_session(rex.BashAction(command="exit()", is_interactive_quit=True, timeout=10))
            assert (await runtime.run_in_session(rex.BashAction(command="echo back"))).output == "back\n"
        finally:
            await deployment.stop()

    asyncio.run(episode())
