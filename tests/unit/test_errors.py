"""An error about one sandbox carries who it is about as a field: the engine's names a container, the node
retells it about the sandbox that container serves, and the tenant's text names the sandbox alone."""

from __future__ import annotations

import pickle

import pytest

from rollbox import errors
from rollbox.errors import AboutSandbox, SandboxNotFound, SandboxNotRunning


@pytest.mark.parametrize("kind", [SandboxNotFound, SandboxNotRunning])
def test_an_engine_error_is_retold_about_the_sandbox_without_its_text_rewritten(kind: type[AboutSandbox]) -> None:
    engine_error = kind("has stopped: reset it or start a new one", container_id="c0ffee")
    assert str(engine_error) == "container c0ffee has stopped: reset it or start a new one"
    told = engine_error.retold("n1-5a11d")
    assert type(told) is kind and told.status == engine_error.status and told.code == engine_error.code
    assert str(told) == "sandbox n1-5a11d has stopped: reset it or start a new one"
    assert (told.sandbox_id, told.container_id) == ("n1-5a11d", "c0ffee"), "the container stays known to the node"


def test_the_ids_survive_a_pickle_and_a_plain_message_stays_as_it_is() -> None:
    told = pickle.loads(pickle.dumps(SandboxNotRunning("is paused", container_id="c1").retold("s1")))
    assert (str(told), told.container_id, told.sandbox_id) == ("sandbox s1 is paused", "c1", "s1")
    rebuilt = errors.from_code("sandbox_not_found", "sandbox s1 does not exist")  # what the SDK makes of the wire
    assert type(rebuilt) is SandboxNotFound and str(rebuilt) == "sandbox s1 does not exist"
    assert errors.ALL["sandbox_not_running"] is SandboxNotRunning
