"""The example on this machine in one command (as root): a Ray cluster of its own (a head and three worker raylets,
each a rollbox node; local_cluster.py), the router in front of it, the rl-python template and warm pool applied
through the router, then demo.py against them; everything it made is deleted at the end.

    .venv/bin/python examples/ray/run_local.py [--executors N]
"""

from __future__ import annotations

import os

# Ray reads these when it is first imported: every node on 127.0.0.1, and each executor's own lines shown
os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_DEDUP_LOGS="0")

import sys
import tempfile
import time
from pathlib import Path

import demo
from local_cluster import local_ray_cluster

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "rl-python.yaml"


def main() -> int:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rollbox-ray-example-", dir="/var/tmp") as root, \
            local_ray_cluster(Path(root)) as cluster:
        print(f"local Ray cluster at {cluster.address} (a head, three rollbox nodes), router at {cluster.url}")
        health = cluster.apply(TEMPLATE)
        print(f"warm pool rl-python: {health['pools']['rl-python']['ready']} ready on "
              f"{', '.join(name for name, node in health['nodes'].items() if node['sandboxes'])} "
              f"({time.perf_counter() - started:.0f} s)\n", flush=True)
        return demo.main(["--address", cluster.address, "--url", cluster.url, "--token", cluster.token, *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
