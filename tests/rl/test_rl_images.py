"""SWE-bench rows whose tasks start from their instance images: pushed to a real registry on loopback, claimed by
image through a real server, judged by applying the test patch in the sandbox as SWE-bench's harness does; and the
collector prefetching the images of the groups to come."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.client import AsyncSandboxClient
from rollbox.engine.images.registry import RegistrySettings
from rollbox.rl.prefetch import Prefetch
from rollbox.rl.prepare import apply_solution
from rollbox.rl.swebench import instance_image, load_swebench
from rollbox.rl.verify import verify
from tests.rl.test_rl_swebench import make_row
from tests.support.registry import ImageMaker, Registry, module_registry
from tests.support.servers import router
from tests.support.swe_images import available, base_layers, repository_layer

PATTERN = "{host}/swebench/sweb.eval.x86_64.{{docker_id}}:latest"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    if not available():
        pytest.skip("needs Debian's python3.11 and git")
    yield from module_registry(tmp_path_factory)


@pytest.fixture(scope="module")
def row(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The acme/calc row of the SWE-bench tests, its instance image pushed where PATTERN says."""
    root = tmp_path_factory.mktemp("swe")
    row = make_row(root)
    checkout = root / "acme__calc"
    import subprocess

    subprocess.run(["git", "-C", str(checkout), "reset", "-q", "--hard", row["base_commit"]], check=True)
    maker = ImageMaker(root / "images")
    maker.image("instance", [*base_layers(), repository_layer(checkout)], env={"PATH": "/usr/bin:/bin"},
                workdir="/testbed")
    registry.push(maker, "instance", "swebench/sweb.eval.x86_64.acme_1776_calc-1", as_tag="latest")
    return row


@pytest.fixture(scope="module")
def url(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = RegistrySettings(insecure=frozenset({registry.host}))
    with router(tmp_path_factory.mktemp("rl-images"), registries=settings) as url:
        yield url


def test_image_pattern_names_each_rows_instance_image() -> None:
    row = {"instance_id": "django__django-11099", "repo": "django/django"}
    assert instance_image("r:5000/sweb.eval.x86_64.{docker_id}:latest", row) == \
        "r:5000/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert instance_image("r/{owner}/{name}:{instance_id}", row) == "r/django/django:django__django-11099"


@pytest.mark.anyio
async def test_tasks_from_instance_images_are_judged_in_them(url: str, registry: Registry,
                                                             row: dict[str, str]) -> None:
    (task,) = load_swebench([row], image=PATTERN.format(host=registry.host), test_command=None)
    assert task.image is not None and task.template is None and task.workdir == "/testbed"
    async with AsyncSandboxClient(url) as client:
        untouched = await client.create_sandbox(**task.start)
        fixed = await client.create_sandbox(**task.start)
        cheated = await client.create_sandbox(**task.start)
        await apply_solution(fixed, task)
        await cheated.files.write("/testbed/tests/test_ops.py", "def test_add():\n    pass\n\n\n"
                                  "def test_sub():\n    pass\n")
        rewards = [(await verify(box, task)).reward for box in (untouched, fixed, cheated)]
        for box in (untouched, fixed, cheated):
            await box.delete()
    assert rewards == [0.0, 1.0, 0.0]


@pytest.mark.anyio
async def test_the_collector_prefetches_the_groups_to_come(url: str, registry: Registry,
                                                           row: dict[str, str]) -> None:
    image = instance_image(PATTERN.format(host=registry.host), row)
    async with AsyncSandboxClient(url) as client:
        ahead = Prefetch(client, [None, None, image, image, None], ahead=2)
        ahead.started(0)  # groups 1 and 2: the first image
        ahead.started(1)  # group 3: the same image, not asked again
        await asyncio.sleep(0)
        deadline = asyncio.get_running_loop().time() + 60
        while not any(image in info.names for info in await client.images.list()):
            assert asyncio.get_running_loop().time() < deadline, "the prefetched image never arrived"
            await asyncio.sleep(0.2)
    assert ahead.asked == 4


def test_task_files_name_an_image(tmp_path: Path) -> None:
    from rollbox.rl.tasks import load_tasks

    (tmp_path / "t.yaml").write_text("id: t\nproblem_statement: p\nimage: r:5000/swe/t:1\nworkdir: /testbed\n"
                                     "tests: {fail_to_pass: [t]}\n")
    (task,) = load_tasks(tmp_path / "t.yaml")
    assert task.start == {"image": "r:5000/swe/t:1", "warmpool": None}
