"""What tracing costs: warm claims and `exec true` through the SDK against two embedded servers, one with tracing
off and one exporting every span by OTLP, the client tracing only while it talks to the second, in alternating
rounds so that both meet the same moments of a shared machine. With a baseline source tree (`--baseline-src`, a
checkout of the code before tracing existed) a third server runs that code: tracing off must cost nothing beside
it.

The spans go to an OTLP/HTTP receiver in this process that reads and drops them, as a collector on another
machine would take them off the server's hands (the server still encodes and sends every span).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.progress import Progress

from common import Figures, distribution, teardown
from cpu import cpu_seconds
from plan import Plan
from pool import NAME, Control
from rollbox import tracing
from rollbox.client import AsyncSandboxClient
from rollbox.engine import Engine
from rollbox.server.local import LocalServer

TARGET = 1.05
"""Tracing on: p50 at most 5% above tracing off."""
SAMPLED = 0.1
"""The share of traces the sampled side records (OTEL_TRACES_SAMPLER=parentbased_traceidratio)."""
SPANS_PER_CALL = 2
"""Spans a claim or an exec records: the SDK's client span and the server's."""


class Sink:
    """An OTLP/HTTP receiver on 127.0.0.1 that counts the batches it is sent and drops them."""

    def __init__(self) -> None:
        self.batches = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                sink.batches += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def environment(**changes: str | None) -> Iterator[None]:
    """os.environ changed meanwhile (None removes a variable): an embedded server inherits it as it starts."""
    before = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


class Side:
    """One embedded server, its client, and the samples taken through them."""

    def __init__(self, name: str, root: Path, tracer: Any, env: dict[str, str | None], pool: int) -> None:
        """`tracer` is the client's while it talks to this server (None: tracing off)."""
        self.name, self.tracer, self.pool = name, tracer, pool
        self.data = root / name
        with environment(**env):
            self.server = LocalServer(self.data, max_sandboxes=2 * pool + 8).start()
        self.client = AsyncSandboxClient(self.server.url)
        self.control = Control(self.server.url, None)
        self.claims: list[float] = []
        self.execs: list[float] = []
        self.cpu = {"claim": [0.0, 0.0], "exec": [0.0, 0.0]}
        """CPU-seconds of the server and of this process (the client) while its timed calls ran, by phase."""

    async def claim_round(self, count: int) -> None:
        held = []
        with self._tracing("claim"):
            for _ in range(count):
                started = time.perf_counter()
                held.append(await self.client.create_sandbox(warmpool=NAME))
                self.claims.append((time.perf_counter() - started) * 1000)
        for sandbox in held:
            await sandbox.delete()

    async def exec_round(self, count: int) -> None:
        sandbox = await self.client.create_sandbox(warmpool=NAME)
        try:
            with self._tracing("exec"):
                for _ in range(count):
                    started = time.perf_counter()
                    await sandbox.commands.run("true")
                    self.execs.append((time.perf_counter() - started) * 1000)
        finally:
            await sandbox.delete()

    @contextlib.contextmanager
    def _tracing(self, phase: str) -> Iterator[None]:
        """This side's tracing in this process while the block runs, and the CPU it took on both ends."""
        tracing.on, tracer, tracing._tracer = self.tracer is not None, tracing._tracer, self.tracer or tracing._tracer
        server, client = cpu_seconds(self.server.pid), time.process_time()
        try:
            yield
        finally:
            tracing.on, tracing._tracer = False, tracer
            self.cpu[phase][0] += cpu_seconds(self.server.pid) - server
            self.cpu[phase][1] += time.process_time() - client

    async def close(self) -> None:
        await self.control.close()
        await self.client.close()
        self.server.close()
        teardown(Engine(self.data))


async def tracing_overhead(plan: Plan, progress: Progress, baseline: Path | None = None) -> Figures:
    """Claim and exec p50 and p99 with tracing off and on (and before tracing, given a baseline tree)."""
    try:
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        return {}
    rounds, count = (4, 24) if plan.claims <= 32 else (8, 48)
    pool = count + 8
    sink = Sink()
    plain: dict[str, str | None] = {key: None for key in os.environ if key.startswith("OTEL_")}
    traced = {**plain, "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint}
    sampled = {**traced, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(SAMPLED)}
    with environment(**traced):
        tracing.enable("otlp")  # this process's spans go to the sink too, but only while a side's `tracer` says so
    tracing.on = False
    sides: list[Side] = []
    task = progress.add_task("tracing off and on: claims and execs in alternating rounds", total=rounds)
    with tempfile.TemporaryDirectory(prefix="rollbox-bench-tracing-", ignore_cleanup_errors=True) as root:
        try:
            sides.append(Side("off", Path(root), None, plain, pool))
            sides.append(Side("on", Path(root), tracing._tracer, traced, pool))
            sides.append(Side("sampled", Path(root), _sampled_tracer(sink), sampled, pool))
            if baseline is not None:
                sides.append(Side("before", Path(root), None, {**plain, "PYTHONPATH": str(baseline / "src")}, pool))
            for side in sides:
                await side.control.apply(pool)
            for number in range(rounds):
                for side in sides if number % 2 == 0 else reversed(sides):
                    await settled(sides)
                    await side.claim_round(count)
                    await settled(sides)
                    await side.exec_round(count)
                progress.advance(task)
            figures = _figures(sides)
            figures["tracing_exec_sdk"]["batches_exported"] = sink.batches
            figures.update(_span_floor(figures))
            return figures
        finally:  # the servers stop before their data directories go
            for side in sides:  # each on its own: one that fails to stop must not leave the others running
                try:
                    await side.close()
                except Exception as error:
                    print(f"stopping the tracing {side.name!r} server failed: {error!r}", flush=True)
            sink.close()


async def settled(sides: list[Side]) -> None:
    """Every server's pool full and nothing starting: no side's round meets another's refill."""
    await asyncio.gather(*(side.control.settle() for side in sides))


def _sampled_tracer(sink: Sink) -> Any:
    """A tracer of its own for the client of the sampled side, which samples as that side's server does."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(SAMPLED)))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{sink.endpoint}/v1/traces")))
    return provider.get_tracer("rollbox")


def _span_floor(figures: Figures, spans: int = 20_000) -> Figures:
    """What OpenTelemetry's SDK itself costs: CPU per span recorded, ended and encoded for OTLP (in this process, no
    network), and the p50 ratio that SPANS_PER_CALL such spans would add to each call if they cost nothing else."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanKind

    class Encoder(SpanExporter):
        def export(self, batch: Any) -> SpanExportResult:
            encode_spans(batch).SerializeToString()
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Encoder()))
    tracer = provider.get_tracer("rollbox")
    attributes = {"http.route": "/v1/sandboxes/{sandbox_id}/exec", "rollbox.operation": "exec_command",
                  "rollbox.sandbox.id": "sb-0123456789abcdef"}
    started = time.process_time()
    for _ in range(spans):
        with tracer.start_as_current_span("POST /v1/sandboxes/{sandbox_id}/exec", kind=SpanKind.SERVER,
                                          attributes=attributes) as span:
            span.set_attribute("http.response.status_code", 200)
    per_span_ms = (time.process_time() - started) / spans * 1000
    provider.shutdown()
    return {"tracing_span_cpu_us": round(per_span_ms * 1000, 1),
            **{f"tracing_{phase}_floor_ratio": round(1 + SPANS_PER_CALL * per_span_ms
                                                     / figures[f"tracing_{phase}_off_sdk"]["p50"], 3)
               for phase in ("claim", "exec")}}


def _figures(sides: list[Side]) -> Figures:
    by_name = {side.name: side for side in sides}
    figures: Figures = {}
    for phase in ("claim", "exec"):
        off, on, sampled = (_measured(by_name[name], phase) for name in ("off", "on", "sampled"))
        figures[f"tracing_{phase}_off_sdk"] = off
        figures[f"tracing_{phase}_sdk"] = {**on, "off_p50": off["p50"], "ratio": round(on["p50"] / off["p50"], 3)}
        figures[f"tracing_{phase}_sampled_sdk"] = {**sampled, "ratio": round(sampled["p50"] / off["p50"], 3)}
        if "before" in by_name:
            before = _measured(by_name["before"], phase)
            figures[f"tracing_{phase}_before_sdk"] = {**before, "off_ratio": round(off["p50"] / before["p50"], 3)}
    return figures


def _measured(side: Side, phase: str) -> Figures:
    """A side's latencies in one phase, and the server's and the client's CPU per call."""
    samples = getattr(side, phase + "s")
    server, client = side.cpu[phase]
    return {**distribution(samples), "server_cpu_ms": round(server / len(samples) * 1000, 3),
            "client_cpu_ms": round(client / len(samples) * 1000, 3)}
