"""`rollbox view`: which file a run names, and a clear error for a path that holds none."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.cli import main
from rollbox.cli.arguments import UsageError
from rollbox.cli.view import run_file


def test_a_run_is_its_file_or_the_file_in_its_directory(tmp_path: Path) -> None:
    jsonl = tmp_path / "trajectories.jsonl"
    jsonl.write_text("")
    assert run_file(tmp_path) == jsonl.resolve() == run_file(jsonl)
    other = tmp_path / "other.jsonl"
    other.write_text("")
    assert run_file(other) == other.resolve()


def test_a_path_without_a_run_is_refused_with_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match=r"holds no trajectories.jsonl: give a trajectories.jsonl or the directory"):
        run_file(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["view", str(tmp_path / "missing.jsonl"), "--no-browser"])
    assert exited.value.code == 1
    assert "missing.jsonl is not a file" in capsys.readouterr().err
