"""Writes the OCI runtime config (`config.json`) of a sandbox: isolation by default.

Defaults: own pid, mount, network (loopback only), ipc, uts and cgroup namespaces; the agent keeps
only the capabilities it needs to start commands as the requested user (commands keep none);
no_new_privs; the default seccomp profile; masked and read-only /proc and /sys paths; cgroup
limits; every read-only bind mounted nosuid and nodev.
"""

from __future__ import annotations

import resource
import shutil
from dataclasses import dataclass, field
from typing import Any

from rollbox.engine.seccomp import default_profile
from rollbox.spec import Limits

AGENT_PATH = "/.rollbox/agent"
COMPAT_PATH = "/.rollbox/compat.so"
AGENT_SOCKET_DIR = "/.rollbox/run"
SANDBOX_ROOT = "/.rollbox/root"
"""Where the sandbox's own root filesystem is bound (read-only, without submounts): the lower layer of its
isolated commands' throw-away roots (agent/command.c)."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
AGENT_CAPABILITIES = ["CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SETPCAP", "CAP_SETFCAP", "CAP_CHOWN"]
"""CAP_CHOWN only until the agent has locked commands out of its socket directory (then it drops it);
CAP_SETFCAP because the kernel asks it of whoever maps root into a user namespace (isolated commands)."""
BUILD_CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_KILL",
    "CAP_AUDIT_WRITE", "CAP_SYS_CHROOT",
]
MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/proc/kallsyms",
    "/sys/firmware", "/sys/devices/virtual/powercap", "/sys/kernel", "/sys/module",
]
READONLY_PATHS = [
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger", "/proc/driver",
]
MOUNT = shutil.which("mount") or "/bin/mount"
_ALLOWED_DEVICES = [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2), (136, None)]


@dataclass
class Bind:
    source: str
    destination: str
    readonly: bool = True
    recursive: bool = True


@dataclass
class ContainerConfig:
    """What differs between containers: everything else is the secure default."""

    args: list[str]
    cgroups_path: str
    limits: Limits
    binds: list[Bind] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    hostname: str = "sandbox"
    build: bool = False
    """A template build step: root with a moderate capability set and the host's network."""
    disk_in_memory: int = 0
    """Bytes of the sandbox's disk that live in RAM (a tmpfs upper): its pages are charged to the
    sandbox's memory cgroup, so the limit grows by that much and a full disk never starves processes."""
    netns: str | None = None
    """A network namespace to join (an egress allowlist's, made by `engine/network.py`) instead of a
    new loopback-only one."""
    proc_binds: list[Bind] = field(default_factory=list)
    """Files bound over /proc entries that runc refuses as mounts (it takes only LXCFS's few), destinations as
    host paths under the root filesystem: bound read-only by a hook that runs in the container's mount namespace
    before its root is pivoted."""


def container_spec(config: ContainerConfig) -> dict[str, Any]:
    limits = config.limits
    capabilities = BUILD_CAPABILITIES if config.build else AGENT_CAPABILITIES
    namespaces = [{"type": kind} for kind in ("pid", "ipc", "uts", "mount", "cgroup")]
    if not config.build:
        namespaces.append({"type": "network", "path": config.netns} if config.netns else {"type": "network"})
    shm_size = min(64 * 2**20, limits.memory)
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={shm_size}"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
    ]
    for bind in config.binds:
        options = ["rbind" if bind.recursive else "bind", "nosuid", "nodev", "ro" if bind.readonly else "rw"]
        mounts.append({"destination": bind.destination, "type": "bind", "source": bind.source,
                       "options": options})
    devices = [{"allow": False, "access": "rwm"}]
    devices += [{"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"}
                if minor is not None else
                {"allow": True, "type": "c", "major": major, "access": "rwm"}
                for major, minor in _ALLOWED_DEVICES]
    period = 100_000
    binds_in_proc = [
        {"path": MOUNT, "args": ["mount", "--bind", "-o", "ro,nosuid,nodev,noexec", bind.source, bind.destination]}
        for bind in config.proc_binds]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": config.args,
            "env": [f"PATH={PATH}", *config.env],
            "cwd": "/",
            "capabilities": {kind: capabilities for kind in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": _nofile(), "soft": _nofile()},
                        {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": config.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": config.cgroups_path,
            "resources": {
                "devices": devices,
                "memory": {"limit": limits.memory + config.disk_in_memory,
                           "swap": limits.memory + config.disk_in_memory},
                "cpu": {"quota": int(limits.cpu * period), "period": period},
                "pids": {"limit": limits.pids},
            },
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
            "seccomp": default_profile(agent_filters=not config.build),
        },
        **({"hooks": {"createContainer": binds_in_proc}} if binds_in_proc else {}),
    }


def _nofile() -> int:
    """65536 open files, or the host's hard limit when lower (raising it needs CAP_SYS_RESOURCE)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
