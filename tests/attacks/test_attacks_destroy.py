"""Attack: `rm -rf /`, as the default user and as root.

The sandbox's root filesystem is an overlay over read-only shared layers, and the host's /usr is
bound read-only, so the most it can destroy is its own upper. The host's files, the template's
layers (shared with every other sandbox) and the neighbour must be untouched, and the sandbox must
either still answer or come back whole after `reset`.
"""

from __future__ import annotations

import contextlib

import pytest

from rollbox.engine import Container, Engine
from rollbox.errors import SandboxNotRunning
from tests.attacks.attack_support import BASELINE, Host, Neighbour, answers_or_resets

RM_BUDGET = {"runc": 60.0, "runsc": 12.0}


@pytest.mark.parametrize("user", [None, "root"], ids=["user", "root"])
def test_rm_rf_root(attack_engine: Engine, box: Container, neighbour: Neighbour, host: Host, runtime_name: str,
                    user: str | None) -> None:
    """`rm -rf --no-preserve-root /` must only ever empty the sandbox's own upper."""
    record = attack_engine.store.container(box.id)
    assert record is not None
    lower_files = [attack_engine.layers.path(layer) / "etc" / "passwd" for layer in record.image.layers
                   if (attack_engine.layers.path(layer) / "etc" / "passwd").is_file()]
    assert lower_files, "the template has no /etc/passwd in its layers"
    lower_before = [path.read_bytes() for path in lower_files]

    # Walking the host's /usr (read-only, ~140k files) through gVisor's gofer takes a minute: bound the
    # real attack by a timeout, then finish the sandbox's own filesystem without descending into binds.
    box.exec("rm -rf --no-preserve-root / 2>/dev/null; echo done", user=user, timeout=RM_BUDGET[runtime_name])
    with contextlib.suppress(SandboxNotRunning):
        box.exec("rm -rf --no-preserve-root --one-file-system / 2>/dev/null", user=user, timeout=60)

    host.check()
    neighbour.check()
    assert [path.read_bytes() for path in lower_files] == lower_before, "a shared lower layer changed"
    # The read-only binds survived the attack inside the sandbox too.
    if answers_or_resets(box, runtime_name, may_die=user == "root") == "alive":
        survived = box.exec("ls /usr/bin/ls && cat /opt/data/file", timeout=30)
        if user is None:
            assert survived.stdout == f"/usr/bin/ls\n{BASELINE}", survived
    # Whatever happened, reset gives back the template's files.
    box.reset()
    after = box.exec("cat /opt/data/file; head -1 /etc/passwd; id -u", timeout=30)
    assert after.stdout == f"{BASELINE}root:x:0:0:root:/root:/bin/bash\n1000\n", after
