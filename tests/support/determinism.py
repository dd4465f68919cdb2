"""The commands agents commonly run whose output used to differ between two episodes of the same actions: the
deterministic mode's targets (docs/determinism.md), shared by tests/engine/test_determinism.py and
bench/determinism.py."""

from __future__ import annotations

TEMPLATE = {
    "metadata": {"name": "deterministic"},
    "spec": {
        "deterministic": True,
        "workdir": "/work",
        "machine": {"cpus": 4, "memory": "2Gi", "kernel": "6.1.0-rollbox"},
        "steps": [{"run": "mkdir -p /work/src && printf '# demo\\n' > /work/README.md && printf 'def add(a, b):\\n"
                          "    return a + b\\n' > /work/src/calc.py && chown -R user:user /work"}],
    },
}
"""No PYTHONHASHSEED and nothing fixed by hand: the mode alone must make these agree."""

PROBES: list[tuple[str, str]] = [
    ("ls --full-time", "ls -la --full-time /work /work/src"),
    ("date", "date; date -u +%s.%N"),
    ("stat", "stat /work/README.md"),
    ("mktemp", "mktemp && mktemp -d && mktemp -u"),
    ("tempfile", "python3 -c 'import tempfile; print(tempfile.mkstemp()[1], tempfile.mkdtemp())'"),
    ("uuid4", "python3 -c 'import uuid; print(uuid.uuid4(), uuid.uuid4())'"),
    ("random", "python3 -c 'import random; print(random.random(), random.randint(0, 10**9))'; seq 10 | shuf | xargs"),
    ("hash()", "python3 -c \"print(hash('rollbox'), hash(b'rollbox'), hash(('a', 1)), {'b', 'a', 'c'})\""),
    ("/proc/uptime", "cat /proc/uptime; uptime"),
    ("free", "free; free -h"),
    ("df", "df -k /"),
    # STAT and the agent's own processes are the scheduler's (docs/determinism.md): the commands' processes are kept
    ("ps", "out=$(ps -eo pid,ppid,user,args); echo \"$out\" | awk '$4 != \"/.rollbox/agent\"'; "
           "python3 -c 'import os; print(os.getpid(), os.getppid())'"),
    ("id/hostname/uname", "id; hostname; uname -a"),
    ("nproc", "nproc; python3 -c 'import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))'"),
    ("file written and listed", "echo hello > notes.txt && ls -l --full-time notes.txt && stat -c '%x|%y|%z|%w' "
                                "notes.txt"),
    ("measured duration", "python3 -c 'import time; t = time.perf_counter(); sum(range(300000)); "
                          "print(time.perf_counter() - t); t = time.monotonic(); time.sleep(0.2); "
                          "print(time.monotonic() - t)'; a=$(date +%s%N); sleep 0.1; b=$(date +%s%N); "
                          "echo $((b - a))"),
    ("sha256sum of the tree", "find /work -type f | sort | xargs sha256sum; tar --sort=name -cf - /work 2>/dev/null "
                              "| sha256sum"),
    ("/dev/urandom", "head -c 16 /dev/urandom | od -An -tx1; od -An -N8 -tx1 /dev/random"),
    ("os.urandom", "python3 -c 'import os, secrets; print(os.urandom(8).hex(), secrets.token_hex(8))'"),
    ("/proc views", "head -3 /proc/meminfo; cat /proc/loadavg; grep -c ^processor /proc/cpuinfo; head -1 /proc/stat"),
]
"""(name, shell command): run in this order, one command each, in a sandbox of TEMPLATE."""

TEMPORARY_NAMES: list[tuple[str, str]] = [
    ("gnulib's names", "mktemp -p /work XXXXXXXX.txt && mktemp -d -p /work"),
    ("the C library's names", "python3 -c \"import ctypes; c = ctypes.CDLL(None); c.tmpnam.restype = ctypes.c_char_p; "
                              "names = [ctypes.create_string_buffer(b'/tmp/' + t) for t in (b'f.XXXXXX', "
                              "b's.XXXXXX.txt', b'd.XXXXXX', b'u.XXXXXX')]; c.mkstemp(names[0]); "
                              "c.mkstemps(names[1], 4); c.mkdtemp(names[2]); c.mktemp(names[3]); "
                              "print(*(n.value.decode() for n in names), c.tmpnam(None).decode())\""),
    ("sort's files", "printf '#!/bin/sh\\n[ \"$1\" = -d ] && exec cat\\nname=$(readlink /proc/$$/fd/1)\\n"
                     "echo \"$name\" >&2\\nexec cat\\n' > /tmp/show && chmod +x /tmp/show && seq 3000 | sort -S 1K "
                     "--parallel=1 --compress-program=/tmp/show 2>&1 >/dev/null | sort | head -3"),
    ("tac's file", "mkfifo /tmp/lines && { tac < /tmp/lines > /tmp/reversed & } && exec 3> /tmp/lines && echo a >&3 "
                   "&& until readlink /proc/$!/fd/3 2>/dev/null | grep -q ^/tmp/tac; do sleep 0.05; done && "
                   "readlink /proc/$!/fd/3 && exec 3>&- && wait && "
                   "cat /tmp/reversed"),
]
"""Temporary names besides mktemp's (each name a program tried is shown): what draws them mixes a stack address
with a clock, gnulib's copy into coreutils' mktemp, and the C library's into mkstemp and its kin, which sort and tac
call (sort's are seen through its compression program, tac's while it reads a pipe, once its temporary file is
open: its locale's file may hold that descriptor first). Run after PROBES: tac's loop
waits as long as the host takes."""
