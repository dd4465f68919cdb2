"""Puts a task's start state into a claimed sandbox: repository, setup commands, planted edits."""

from __future__ import annotations

from rollbox.client import AsyncSandbox
from rollbox.errors import RollboxError, TaskSetupFailed
from rollbox.rl.edits import apply_edit, resolve
from rollbox.rl.repo import staged
from rollbox.rl.tasks import Edit, Task

SETUP_TIMEOUT = 600.0


async def prepare(sandbox: AsyncSandbox, task: Task) -> None:
    if task.repo is not None:
        await sandbox.files.upload_dir(staged(task.repo), task.workdir)
    for command in task.setup:
        result = await sandbox.commands.run(command, cwd=task.workdir, timeout=SETUP_TIMEOUT)
        if not result.ok:
            raise TaskSetupFailed(f"task {task.id}: setup command {command!r} exited with {result.exit_code}: "
                                  f"{(result.stdout + result.stderr)[-2000:]}")
    try:
        await apply_edits(sandbox, task.workdir, task.setup_edits)
    except RollboxError as error:
        raise TaskSetupFailed(f"task {task.id}: setup edit failed: {error}") from None


async def apply_edits(sandbox: AsyncSandbox, workdir: str, edits: tuple[Edit, ...]) -> None:
    for edit in edits:
        await apply_edit(sandbox.files, resolve(workdir, edit.path), edit.old, edit.new)


async def apply_solution(sandbox: AsyncSandbox, task: Task) -> None:
    """Applies the reference fix (edits, or a diff with `git apply`): how tasks are checked."""
    if isinstance(task.solution, str):
        result = await sandbox.commands.run("git apply --whitespace=nowarn -", stdin=task.solution, cwd=task.workdir)
        if not result.ok:
            raise TaskSetupFailed(f"task {task.id}: the solution patch does not apply: {result.stderr[-2000:]}")
    elif task.solution:
        await apply_edits(sandbox, task.workdir, task.solution)
    else:
        raise TaskSetupFailed(f"task {task.id} has no solution to apply")
