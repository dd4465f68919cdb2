"""Model gateway benchmark: what the gateway adds to a model call, and 64 sandboxes streaming through it at once
(docs/gateway.md).

Run as root: `.venv/bin/python bench/gateway.py [--quick]`. It starts a scripted OpenAI-compatible server (the
tests' `ScriptedModel`, in a process of its own on loopback: the trainer's inference server) and the embedded
server (`LocalServer`) with a runc template and a warm pool, then:

- **latency**: one sandbox claimed with `model_gateway=`; a client (Python's `http.client`, one kept-alive
  connection, a small non-streamed chat completion per call) runs inside it against OPENAI_BASE_URL, and the same
  client with the same interpreter (`/usr/bin/python3`, which the host template shares) runs on the host against
  the scripted server directly: the baseline. The two take turns, rounds of calls each. The added latency is the
  difference of their medians (and of their p99s).
- **streams**: 64 sandboxes with gateways, each streaming one chat completion of 200 tokens (5 ms apart) at the
  same moment. Every sandbox must receive every token in order, and every sandbox's record (`model_calls`) must
  hold the whole answer: its text, its 200 token ids and log-probabilities, and its usage. Reported: the wall
  time from start to the last stream's end, each stream's time to its first token, and tokens lost.

It prints the machine, a table and, as its last line, one JSON object of every figure (milliseconds unless named
otherwise) with `missed`: the targets not met (added latency p50 <= 1 ms; no token lost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common import Figures, distribution, load, machine
from rollbox.client import AsyncSandboxClient, SandboxClient
from rollbox.server.local import LocalServer

REPO = Path(__file__).resolve().parents[1]
POOL = "gateway-bench"
STREAMS = 64
TOKENS = 200
TARGETS = {"added_latency_p50_ms": 1.0, "lost_tokens": 0}
DOCUMENTS = f"""\
apiVersion: rollbox.dev/v1alpha1
kind: SandboxTemplate
metadata: {{name: {POOL}}}
spec: {{runtime: runc}}
---
apiVersion: rollbox.dev/v1alpha1
kind: SandboxWarmPool
metadata: {{name: {POOL}}}
spec: {{replicas: {STREAMS + 1}, sandboxTemplateRef: {{name: {POOL}}}}}
"""
UPSTREAM = f"""
import sys, threading
sys.path.insert(0, {str(REPO)!r})
from tests.support.openai_server import ScriptedModel, serving
with serving(ScriptedModel(delay=0.005)) as url:
    print(url, flush=True)
    threading.Event().wait()
"""
CALLS = """
import http.client, json, sys, time, urllib.parse
base, key, count = urllib.parse.urlsplit(sys.argv[1]), sys.argv[2], int(sys.argv[3])
connection = http.client.HTTPConnection(base.hostname, base.port or 80)
body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "ping"}]})
headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
times = []
for _ in range(count):
    start = time.perf_counter()
    connection.request("POST", base.path + "/chat/completions", body, headers)
    answer = connection.getresponse()
    assert answer.status == 200 and b"echo: ping" in answer.read()
    times.append((time.perf_counter() - start) * 1000)
print(json.dumps(times))
"""
STREAM = """
import http.client, json, os, sys, time
words = int(sys.argv[1])
connection = http.client.HTTPConnection("127.0.0.1", 80)
body = json.dumps({"model": "policy", "stream": True, "logprobs": True, "return_token_ids": True,
                   "messages": [{"role": "user", "content": " ".join(f"t{n}" for n in range(words - 1))}]})
start = time.perf_counter()
connection.request("POST", "/v1/chat/completions", body, {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
answer = connection.getresponse()
text, first = "", None
for line in answer:
    if line.startswith(b"data: {"):
        for choice in json.loads(line[6:])["choices"]:
            piece = choice["delta"].get("content") or ""
            if piece and first is None:
                first = (time.perf_counter() - start) * 1000
            text += piece
ms = (time.perf_counter() - start) * 1000
print(json.dumps({"status": answer.status, "text": text, "first_ms": first, "ms": ms}))
"""


def latency(client: SandboxClient, upstream: str, rounds: int, count: int) -> Figures:
    with client.create_sandbox(warmpool=POOL, model_gateway={"upstream": upstream}) as sandbox:
        key = sandbox.commands.run("printf %s $OPENAI_API_KEY").stdout
        through, direct = [], []
        for _ in range(rounds + 1):  # the first round warms both sides and is not counted
            inside = sandbox.commands.run(["python3", "-c", CALLS, "http://127.0.0.1/v1", key, str(count)],
                                          timeout=600)
            outside = subprocess.run(["/usr/bin/python3", "-c", CALLS, upstream, "none", str(count)],
                                     capture_output=True, text=True, check=True)
            if inside.exit_code != 0:
                raise RuntimeError(f"the client in the sandbox failed: {inside.stderr}")
            through.append(json.loads(inside.stdout))
            direct.append(json.loads(outside.stdout))
        recorded = sandbox.model_calls().count
    through_ms = distribution([ms for batch in through[1:] for ms in batch])
    direct_ms = distribution([ms for batch in direct[1:] for ms in batch])
    return {"through_gateway": through_ms, "direct": direct_ms, "recorded": recorded,
            "added_latency_p50_ms": round(through_ms["p50"] - direct_ms["p50"], 3),
            "added_latency_p99_ms": round(through_ms["p99"] - direct_ms["p99"], 3)}


async def streams(url: str, upstream: str) -> Figures:
    async with AsyncSandboxClient(url) as client:
        sandboxes = await asyncio.gather(*(client.create_sandbox(warmpool=POOL, model_gateway={"upstream": upstream})
                                           for _ in range(STREAMS)))
        await client.delete_warmpool(POOL)  # no refill of 64 sandboxes beside the streams
        try:
            start = time.perf_counter()
            results = await asyncio.gather(*(sandbox.commands.run(["python3", "-c", STREAM, str(TOKENS)], timeout=300)
                                             for sandbox in sandboxes))
            wall = (time.perf_counter() - start) * 1000
            logs = await asyncio.gather(*(sandbox.model_calls() for sandbox in sandboxes))
        finally:
            await asyncio.gather(*(sandbox.delete() for sandbox in sandboxes))
    expected = "echo: " + " ".join(f"t{n}" for n in range(TOKENS - 1))
    lost, firsts, failures = 0, [], []
    for result, log in zip(results, logs, strict=True):
        seen = json.loads(result.stdout) if result.exit_code == 0 else {"text": "", "first_ms": None}
        record = log.calls[0] if log.calls else None
        if result.exit_code != 0 or seen.get("status") != 200:
            failures.append({"client": seen.get("status") or result.stderr[-300:],
                             "record": record and {"status": record.status, "error": record.error}})
        received = seen["text"].split(" ")
        lost += TOKENS - sum(1 for got, want in zip(received, expected.split(" "), strict=False) if got == want)
        if seen["first_ms"] is not None:
            firsts.append(seen["first_ms"])
        recorded = record.response["choices"][0]["message"]["content"] if record and record.response else ""
        if (recorded != expected or len(record.token_ids or []) != TOKENS or len(record.logprobs or []) != TOKENS
                or record.completion_tokens != TOKENS):
            lost += 1 if recorded == expected else TOKENS
    return {"streams": STREAMS, "tokens_each": TOKENS, "wall_ms": round(wall, 1), "lost_tokens": lost,
            "first_token": distribution(firsts), "failures": failures[:3]}


def report(figures: Figures) -> Table:
    m = figures["machine"]
    table = Table(title=f"model gateway ({m['cores']} cores, {m['memory_mb']} MB, kernel {m['kernel']}, "
                        f"load {m['load_before']} -> {m['load_after']})")
    for column in ("what", "p50 ms", "p99 ms", "n", "target"):
        table.add_column(column)
    lat, streamed = figures["latency"], figures["streams"]
    for name, key in (("call through the gateway", "through_gateway"), ("call direct (baseline)", "direct")):
        table.add_row(name, f"{lat[key]['p50']:.3f}", f"{lat[key]['p99']:.3f}", str(lat[key]["n"]), "")
    table.add_row("added by the gateway", f"{lat['added_latency_p50_ms']:.3f}", f"{lat['added_latency_p99_ms']:.3f}",
                  "", "p50 <= 1 ms")
    first = streamed["first_token"]
    table.add_row(f"{STREAMS} streams: first token", f"{first['p50']:.1f}", f"{first['p99']:.1f}", str(first["n"]), "")
    table.add_row(f"{STREAMS} streams x {TOKENS} tokens: wall", f"{streamed['wall_ms']:.0f}", "", "",
                  f"lost {streamed['lost_tokens']} (target 0)")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 100 calls (not 5 of 400)")
    args = parser.parse_args()
    rounds, count = (3, 100) if args.quick else (5, 400)
    figures: Figures = {"machine": machine(), "mode": "quick" if args.quick else "full"}
    started = time.perf_counter()
    scripted = subprocess.Popen([sys.executable, "-c", UPSTREAM], stdout=subprocess.PIPE, text=True)
    try:
        upstream = (scripted.stdout.readline() if scripted.stdout else "").strip()
        with tempfile.TemporaryDirectory(prefix="rollbox-bench-") as root:
            server = LocalServer(Path(root))
            try:
                server.start()
                with SandboxClient(server.url) as client:
                    client.apply(DOCUMENTS)
                    deadline = time.monotonic() + 300
                    while client.get_warmpool(POOL).ready < STREAMS + 1 and time.monotonic() < deadline:
                        time.sleep(0.1)
                    figures["latency"] = latency(client, upstream, rounds, count)
                figures["streams"] = asyncio.run(streams(server.url, upstream))
            finally:
                server.close()
    finally:
        scripted.terminate()
        scripted.wait(10)
    figures["machine"]["load_after"] = load()
    figures["elapsed_s"] = round(time.perf_counter() - started, 1)
    figures["missed"] = [name for name, met in (
        ("added_latency_p50_ms", figures["latency"]["added_latency_p50_ms"] <= TARGETS["added_latency_p50_ms"]),
        ("lost_tokens", figures["streams"]["lost_tokens"] == TARGETS["lost_tokens"]),
    ) if not met]
    Console(width=160).print(report(figures))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
