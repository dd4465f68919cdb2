"""What fuzzing the API (tests/e2e/test_api_fuzz.py) found, each kept as the request that showed it."""

from __future__ import annotations

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from rollbox.models import ExecRequest, ProcessRequest, ShellRequest

pytestmark = pytest.mark.anyio
HUGE = "1" + "0" * 400
"""An integer JSON allows and a float cannot hold."""
JSON = {"content-type": "application/json"}


def refused(answer: httpx.Response) -> None:
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("field", ["shutdown_after", "idle_pause_after"])
@pytest.mark.parametrize("value", [HUGE, f"-{HUGE}", "1e999", "Infinity"])
async def test_a_duration_past_a_float_is_refused(http: httpx.AsyncClient, field: str, value: str) -> None:
    """A huge integer overflowed in float() while the body was parsed: 500 instead of 422."""
    refused(await http.post("/v1/sandboxes", content=f'{{"warmpool": "pool", "{field}": {value}}}', headers=JSON))


@pytest.mark.parametrize("path", ["exec", "exec/stream"])
@pytest.mark.parametrize("value", ["1e308", "1e999", "Infinity", HUGE])
async def test_a_command_timeout_past_any_clock_is_refused(http: httpx.AsyncClient, path: str, value: str) -> None:
    """The timeout went to the agent in milliseconds, int(inf) raised: 500 once the sandbox was found."""
    refused(await http.post(f"/v1/sandboxes/any/{path}", content=f'{{"command": "true", "timeout": {value}}}',
                            headers=JSON))


async def test_every_operation_documents_the_errors_it_answers(http: httpx.AsyncClient) -> None:
    """A `default` answer let any status, 500 included, pass as documented; each error status is listed instead."""
    document = (await http.get("/openapi.json")).json()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            errors = [status for status in responses if int(status) >= 400]
            assert "default" not in responses and "400" in errors, (method, path)
            assert all(int(status) < 500 for status in errors), (method, path)
            assert ("401" in errors) == ("security" in operation), (method, path)
            for status in errors:
                schema = responses[status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)


async def test_a_volume_that_exists_already_is_a_documented_conflict(http: httpx.AsyncClient) -> None:
    """Once a size could be written as text (`1Gi`), the fuzz created a volume twice: 409 `volume_in_use`, which the
    document did not list for POST /v1/volumes; a claim whose volume another sandbox writes answers 409 too."""
    paths = (await http.get("/openapi.json")).json()["paths"]
    assert "409" in paths["/v1/volumes"]["post"]["responses"] and "409" in paths["/v1/sandboxes"]["post"]["responses"]


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "1e999", "NaN", HUGE])
async def test_a_volume_size_past_a_float_is_refused(http: httpx.AsyncClient, value: str) -> None:
    """int(inf) and float(HUGE) raised OverflowError, which no validator turns into a 422: 500."""
    refused(await http.post("/v1/volumes", content=f'{{"name": "v", "size": {value}}}', headers=JSON))


@pytest.mark.parametrize("model", [ExecRequest, ProcessRequest, ShellRequest])
def test_a_working_directory_past_path_max_is_refused(model: type[BaseModel]) -> None:
    """A 2 MB `cwd` left a background process's description without its parts, which the host could not read."""
    with pytest.raises(ValidationError, match="at most 4096 characters"):
        model.model_validate({"cwd": "x" * 4097, **({"command": "true"} if "command" in model.model_fields else {})})
