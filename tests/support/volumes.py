"""What a test checks of volumes on the machine: the loop devices attached and the mounts."""

from __future__ import annotations

import subprocess


def loop_devices() -> str:
    """`losetup -a`: every loop device and the file behind it."""
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout


def mounted() -> set[str]:
    """Every mount point of this mount namespace."""
    with open("/proc/self/mounts") as table:
        return {line.split()[1] for line in table}
