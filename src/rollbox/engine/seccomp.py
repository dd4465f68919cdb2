"""The default seccomp profile of a sandbox.

Every capability is already dropped, so most privileged syscalls fail anyway; this profile removes
the kernel surface that stays reachable without capabilities and has a history of escapes: new
namespaces (unprivileged user namespaces above all), io_uring, bpf, userfaultfd, keyrings,
perf events, and the mount family.

The exec agent needs a few of those calls to run isolated commands (namespaces, mounts, pivot_root):
sandboxes whose init is the agent get them from this profile, and the agent takes them away from
every command it runs with a filter of its own (`deny_namespaces` in agent/command.c).
"""

from __future__ import annotations

from typing import Any

EPERM = 1
ENOSYS = 38
_CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

DENIED = [
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module",
    "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "init_module",
    "io_uring_enter", "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kexec_file_load",
    "kexec_load", "keyctl", "lookup_dcookie", "mount_setattr", "move_mount",
    "name_to_handle_at", "nfsservctl", "open_by_handle_at", "open_tree", "perf_event_open",
    "process_vm_readv", "process_vm_writev", "query_module", "quotactl",
    "quotactl_fd", "reboot", "request_key", "setns", "settimeofday", "stime", "swapoff", "swapon",
    "syslog", "_sysctl", "uselib", "userfaultfd", "ustat", "vhangup",
    "vm86", "vm86old", "fanotify_init", "open_tree_attr", "move_pages", "migrate_pages",
]
AGENT_FILTERED = ["mount", "pivot_root", "umount", "umount2", "unshare"]
"""Denied to commands by the agent's own filter rather than by this profile, which the agent is under too."""


def default_profile(agent_filters: bool) -> dict[str, Any]:
    """`agent_filters`: the container's init is the exec agent, which denies AGENT_FILTERED to commands."""
    denied = DENIED if agent_filters else [*DENIED, *AGENT_FILTERED]
    rules: list[dict[str, Any]] = [
        {"names": denied, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
        # clone3 passes its flags in memory that seccomp cannot read: make libc fall back to clone.
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
    ]
    for flag in _CLONE_NAMESPACE_FLAGS.values():
        rules.append({
            "names": ["clone"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
        })
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules,
    }
