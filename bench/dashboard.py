"""Dashboard benchmark: first paint with many sandboxes, and the page's memory over a long run of updates.

Run as root: `.venv/bin/python bench/dashboard.py [--sandboxes 1000] [--real 48] [--duration 600]`. Chromium
(Debian's, driven by Playwright) loads /dashboard from a server in this process, as an admin, with the token
already in the tab's sessionStorage, and times each load from navigation to the first paint (the browser's
first-contentful-paint) and to the first update drawn with the data (the page's own mark, set when the first
table of sandboxes is on screen). Three servers, one after the other:

- SIMULATED: `--sandboxes` claims (1,000 by default) on bench/simulated_node.py's in-memory node, behind the real
  app, routes and tokens: one machine cannot hold 1,000 real sandboxes beside a browser, so this is the figure
  for the issue's target, and it is named a simulation. It keeps no stats (CPU and memory cells stay empty);
- BASELINE: the same with 10 claims, the same run's floor;
- REAL: `--real` real sandboxes (48 by default) on a LocalNode over a throw-away engine, with their stats.

Then the page stays open on the simulated server for `--duration` seconds (the issue asks for ten minutes; CI
runs a short one) while claims come and go, and the JS heap after a forced collection and the page's element
count are sampled every `--sample-every` seconds: both must end where they began (within HEAP_SLACK), and the
updates must come at least every 2 s. The last line is one JSON object with a `missed` list.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from playwright.sync_api import Page, sync_playwright

from common import distribution, machine, throwaway_engine
from rollbox.client import SandboxClient
from rollbox.node import LocalNode
from rollbox.server import create_app
from rollbox.server.threaded import ThreadServer
from simulated_node import SimulatedNode

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKENS = {"admin": "bench-admin-token", "tenant": "bench-tenant-token"}
TEMPLATE = "apiVersion: rollbox.dev/v1alpha1\nkind: SandboxTemplate\nmetadata: {name: dash}\nspec: {base: host}\n"
FIRST_PAINT_TARGET_MS = 1000
UPDATE_TARGET_S = 2.0
HEAP_SLACK = 1 * 2**20
"""What the JS heap may end above where it began, after a forced collection: far under what 1,000 rows leaked
once per update would leave after a few minutes."""
LOADS = 7


@contextlib.contextmanager
def served(node: Any) -> Iterator[str]:
    with ThreadServer(create_app(node, TOKENS, admins=["admin"]), tcp=True) as server:
        with SandboxClient(server.url, TOKENS["admin"]) as admin:
            admin.apply(TEMPLATE)
        yield server.url


def claim(url: str, count: int, concurrency: int = 8) -> list[str]:
    """`count` sandboxes, half the admin's and half the tenant's, labelled, through the API."""
    def one(index: int) -> str:
        tenant = "admin" if index % 2 else "tenant"
        with SandboxClient(url, TOKENS[tenant]) as client:
            return client.create_sandbox(template="dash", labels={"bench": "dashboard", "n": str(index)}).id
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(count)))


def load_times(page: Page, url: str, loads: int) -> dict[str, Any]:
    """Milliseconds from navigation to first paint and to the first update on screen, over `loads` fresh loads."""
    paints, updates = [], []
    rows = 0
    for _ in range(loads):
        page.goto("about:blank")
        page.goto(f"{url}/dashboard")
        page.wait_for_selector("body[data-updates]", timeout=60_000)
        paints.append(page.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime"))
        updates.append(page.evaluate("performance.getEntriesByName('rollbox-first-update')[0].startTime"))
        rows = page.locator("#sandboxes tbody tr").count()
    return {"first_paint_ms": distribution(paints), "first_update_ms": distribution(updates), "rows": rows,
            "listed": int(page.text_content("#sandbox-count") or 0)}


def heap(page: Page, cdp: Any) -> dict[str, int]:
    cdp.send("HeapProfiler.collectGarbage")
    used = cdp.send("Runtime.getHeapUsage")["usedSize"]
    return {"heap": int(used), "elements": page.evaluate("document.getElementsByTagName('*').length"),
            "updates": int(page.get_attribute("body", "data-updates") or 0)}


def long_run(page: Page, url: str, duration: float, every: float) -> dict[str, Any]:
    """The page open for `duration` seconds while one sandbox is deleted and another claimed each second."""
    cdp = page.context.new_cdp_session(page)
    page.goto(f"{url}/dashboard")
    page.wait_for_selector("body[data-updates]")
    time.sleep(min(10.0, duration / 4))  # past the first updates' one-off allocations (charts, row pool)
    samples = [heap(page, cdp)]
    seen, changes = samples[0]["updates"], []
    started = time.monotonic()
    next_sample = started + every
    with SandboxClient(url, TOKENS["tenant"]) as client:
        while time.monotonic() - started < duration:
            client.list_sandboxes()[0].delete()
            client.create_sandbox(template="dash", labels={"bench": "churn"})
            for _ in range(4):
                time.sleep(0.25)
                now = page.get_attribute("body", "data-updates")
                if now and int(now) != seen:
                    seen = int(now)
                    changes.append(time.monotonic())
            if time.monotonic() >= next_sample:
                samples.append(heap(page, cdp))
                next_sample += every
    samples.append(heap(page, cdp))
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    return {"seconds": duration, "samples": samples, "heap_growth_bytes": samples[-1]["heap"] - samples[0]["heap"],
            "elements_growth": samples[-1]["elements"] - samples[0]["elements"],
            "update_interval_s": distribution(gaps) if gaps else {"p50": None, "p99": None, "n": 0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxes", type=int, default=1000, help="simulated sandboxes (%(default)s)")
    parser.add_argument("--real", type=int, default=48, help="real sandboxes (%(default)s; 0: none)")
    parser.add_argument("--duration", type=float, default=600, help="seconds of the long run (%(default)s)")
    parser.add_argument("--sample-every", type=float, default=30, help="seconds between heap samples (%(default)s)")
    parser.add_argument("--loads", type=int, default=LOADS, help="page loads timed per server (%(default)s)")
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": machine(), "simulated_sandboxes": args.sandboxes}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.add_init_script(f"sessionStorage.setItem('rollbox-token', {json.dumps(TOKENS['admin'])})")
        page = context.new_page()
        try:
            for name, count in (("baseline", 10), ("simulated", args.sandboxes)):
                with served(SimulatedNode("sim", count + 64)) as url:
                    claim(url, count, concurrency=16)
                    figures[name] = {"sandboxes": count, **load_times(page, url, args.loads)}
                    if name == "simulated":
                        figures["long_run"] = long_run(page, url, args.duration, args.sample_every)
            if args.real:
                with throwaway_engine() as engine:
                    node = LocalNode(engine, max_sandboxes=args.real + 8)
                    try:
                        with served(node) as url:
                            claim(url, args.real)
                            figures["real"] = {"sandboxes": args.real, **load_times(page, url, args.loads)}
                    finally:
                        node.close()
        finally:
            browser.close()
    report(figures)


def report(figures: dict[str, Any]) -> None:
    print(f"machine: {figures['machine']}")
    for name in ("baseline", "simulated", "real"):
        if name in figures:
            f = figures[name]
            print(f"{name:>9} ({f['sandboxes']} sandboxes{', SIMULATED node' if name != 'real' else ''}): first paint "
                  f"p50 {f['first_paint_ms']['p50']:.0f} ms p99 {f['first_paint_ms']['p99']:.0f} ms; first update "
                  f"p50 {f['first_update_ms']['p50']:.0f} ms p99 {f['first_update_ms']['p99']:.0f} ms; "
                  f"{f['rows']} rows of {f['listed']} listed")
    run = figures["long_run"]
    print(f"long run ({run['seconds']:.0f} s, SIMULATED node): heap {run['samples'][0]['heap'] / 2**20:.2f} -> "
          f"{run['samples'][-1]['heap'] / 2**20:.2f} MiB (growth {run['heap_growth_bytes'] / 2**10:+.0f} KiB), "
          f"elements {run['samples'][0]['elements']} -> {run['samples'][-1]['elements']}, "
          f"update interval p50 {run['update_interval_s']['p50']} s p99 {run['update_interval_s']['p99']} s")
    missed = []
    if figures["simulated"]["first_update_ms"]["p50"] > FIRST_PAINT_TARGET_MS:
        missed.append("first_update_1000")
    if figures["simulated"]["rows"] == 0:
        missed.append("rows_shown")
    if run["heap_growth_bytes"] > HEAP_SLACK or run["elements_growth"] > 0:
        missed.append("memory_flat")
    if not run["update_interval_s"]["n"] or run["update_interval_s"]["p99"] > UPDATE_TARGET_S:
        missed.append("update_every_2s")
    figures["missed"] = missed
    figures["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
