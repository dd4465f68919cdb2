"""Closing an engine: what it leaves on the machine outside its data directory."""

from __future__ import annotations

from pathlib import Path

from rollbox.engine import Engine
from rollbox.spec import SandboxTemplate
from tests.support.engines import BASIC, leftovers


def test_closing_without_containers_leaves_no_run_or_cgroup_directory(tmp_path: Path) -> None:
    """A server stopped with containers keeps their run directory and cgroups for the next one, which adopts
    them; stopped after its last container went, it leaves neither behind."""
    data = tmp_path / "data"
    engine = Engine(data)
    try:
        engine.build(SandboxTemplate.model_validate(BASIC))
        kept = engine.create("basic").id
        engine.close()
        left = leftovers(data)
        assert any(path.endswith(f"rollbox/{engine.id}") for path in left), left
        assert str(engine.run_dir) in left

        engine = Engine(data)
        assert engine.get(kept).exec("true").exit_code == 0, "the next engine adopts what the first left running"
        engine.delete(kept)
        engine.create("basic").delete()
        engine.close()
        assert leftovers(data) == []
    finally:
        with Engine(data) as engine:
            engine.destroy()
