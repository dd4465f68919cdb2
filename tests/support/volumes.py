"""What a test checks of volumes on the machine: the loop devices attached and the mounts."""

from __future__ import annotations

import subprocess

from tests.support.cluster import wait_for


def loop_devices() -> str:
    """`losetup -a`: every loop device and the file behind it."""
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout


def mounted() -> set[str]:
    """Every mount point of this mount namespace."""
    with open("/proc/self/mounts") as table:
        return {line.split()[1] for line in table}


def wait_detached(image: str) -> None:
    """Waits for the kernel to let go of the loop device over `image`, which it does once nothing holds the volume's
    filesystem: moments after it was unmounted on a busy machine. A stopped container's mounts are freed by a kernel
    worker after its last process exits, and a mount namespace another process makes meanwhile (any container
    starting) holds a copy of every mount until it lets go of the host's tree."""
    wait_for(lambda: image not in loop_devices(), f"the loop device over {image} detached", 10)
