"""Every block of the README and docs/*.md that is meant to run, run against a real server (rules: conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import Block, every_block
from tests.docs.check import check, check_parses

BLOCKS = every_block()
RUN = [block for block in BLOCKS if block.runs]
PARSED = [block for block in BLOCKS if block.language == "python" and not block.runs]


@pytest.mark.parametrize("block", RUN, ids=[block.where for block in RUN])
def test_a_block_runs_and_prints_what_it_says(block: Block, server: str, workspace: Path) -> None:
    failure = check(block, server, workspace)
    if failure:
        pytest.fail(failure, pytrace=False)


@pytest.mark.parametrize("block", PARSED, ids=[block.where for block in PARSED])
def test_a_python_block_not_meant_to_run_still_parses(block: Block) -> None:
    failure = check_parses(block)
    if failure:
        pytest.fail(failure, pytrace=False)
