"""A `debian:<suite>` base is bootstrapped from the mirror the machine's own apt sources name."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.engine import bases
from rollbox.errors import InvalidResource


def test_apt_mirror_comes_from_the_machines_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.invalid/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one-line.invalid/debian bullseye main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb-src\nURIs: http://sources-only.invalid/debian\nSuites: trixie\nComponents: main\n\n"
        "Types: deb\nURIs: http://disabled.invalid/debian\nSuites: trixie\nEnabled: no\n\n"
        "Types: deb\n# a comment inside the paragraph\nURIs: http://deb822.invalid/debian\n"
        "Suites: trixie\n  trixie-updates\nComponents: main\n")
    assert bases.apt_mirror("bullseye", tmp_path) == "http://one-line.invalid/debian"
    assert bases.apt_mirror("trixie-updates", tmp_path) == "http://deb822.invalid/debian"
    with pytest.raises(InvalidResource, match="found no Debian mirror for 'sid'"):
        bases.apt_mirror("sid", tmp_path / "empty")
