"""Images made by the tests themselves, without network: Debian's static busybox in one layer."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

BUSYBOX = Path("/bin/busybox")


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def busybox_layout(work: Path) -> Path:
    """An OCI layout whose tag `base` holds /bin/busybox and /bin/sh, with GREETING=hello and workdir /work."""
    if not BUSYBOX.is_file():
        pytest.skip("needs busybox-static (scripts/setup.sh installs it)")
    layout, root = work / "layout", work / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    run("umoci", "init", "--layout", str(layout))
    run("umoci", "new", "--image", f"{layout}:base")
    run("umoci", "insert", "--image", f"{layout}:base", str(root / "bin"), "/bin")
    run("umoci", "config", "--image", f"{layout}:base", "--config.env", "GREETING=hello",
        "--config.workingdir", "/work")
    return layout
