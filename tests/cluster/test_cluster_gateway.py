"""The model gateway through a cluster: a claim made at the router gets its gateway on whichever node serves the
sandbox, an agent inside calls it, and the trainer reads the calls back through the router (its tenant only)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollbox import errors
from rollbox.client import SandboxClient
from tests.cluster.conftest import NODES, POOL
from tests.support.cluster import claim_on_every_node
from tests.support.openai_server import ScriptedModel, serving

ASK = ("import json, os, urllib.request\n"
       "r = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=json.dumps({'model': 'm',"
       " 'stream': True, 'messages': [{'role': 'user', 'content': os.environ['QUESTION']}]}).encode(),"
       " headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
       "print(urllib.request.urlopen(r, timeout=60).read().decode().count('data: {'))\n")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with serving(ScriptedModel()) as url:
        yield url


def test_gateway_on_every_node(client: SandboxClient, bob: SandboxClient, upstream: str) -> None:
    held = claim_on_every_node(client, POOL, NODES, model_gateway={"upstream": upstream, "max_requests": 4})
    sandboxes = list(held.values())
    try:
        for n, sandbox in enumerate(sandboxes):
            result = sandbox.commands.run(["python3", "-c", ASK], env={"QUESTION": f"w{n} x y"}, timeout=60)
            assert result.stdout.strip() == "7", result.stderr  # role, 4 words, finish, usage
            log = sandbox.model_calls()
            assert log.count == 1 and log.calls[0].response["choices"][0]["message"]["content"] == f"echo: w{n} x y"
            with pytest.raises(errors.SandboxNotFound):
                bob.get_sandbox(sandbox.id)
        with pytest.raises(errors.NotFound):
            SandboxClient(client.base_url, token="bob-token").get_sandbox(sandboxes[0].id).model_calls()
    finally:
        for sandbox in sandboxes:
            sandbox.delete()
