"""Both ends of a trace for the tests: an OTLP/HTTP receiver standing in for a collector (what a traced server in
another process exports to), and this process's spans kept in memory."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rollbox import tracing


@dataclass(frozen=True)
class Span:
    """One span, wherever it was recorded: ids as hex, attributes as plain values."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    duration_ms: float = 0.0


class Receiver:
    """An OTLP/HTTP collector stand-in on 127.0.0.1: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    self.spans.append(Span(span.name, span.trace_id.hex(), span.span_id.hex(),
                                           span.parent_span_id.hex(), service, attributes,
                                           (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6))

    def wait_for(self, name: str, count: int = 1, timeout: float = 15.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while len(found := [span for span in self.spans if span.name == name]) < count:
            assert time.monotonic() < deadline, f"no {name} span reached the collector: {self.spans}"
            time.sleep(0.05)
        return found

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


_memory = InMemorySpanExporter()
_installed = False


@contextlib.contextmanager
def exporting_to(receiver: Receiver, **variables: str) -> Iterator[None]:
    """The environment, while the block runs, of a server that exports every span to `receiver` in 50 ms batches
    (and `variables`): start the server in the block, and it keeps what it read after the block put them back."""
    with pytest.MonkeyPatch.context() as environment:
        for name, value in {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                            "OTEL_BSP_SCHEDULE_DELAY": "50", **variables}.items():
            environment.setenv(name, value)
        yield


@contextlib.contextmanager
def traced_here() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, its spans kept in memory, and off again after (the provider is global and set
    once per process, so every test shares it)."""
    global _installed
    if not _installed:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(_memory))
        _installed = True
    _memory.clear()
    tracing.enable()
    try:
        yield _memory
    finally:
        tracing.on = False
        _memory.clear()


def local(span: ReadableSpan) -> Span:
    context, parent = span.get_span_context(), span.parent
    return Span(span.name, f"{context.trace_id:032x}", f"{context.span_id:016x}",
                f"{parent.span_id:016x}" if parent else "", "", dict(span.attributes or {}),
                ((span.end_time or 0) - (span.start_time or 0)) / 1e6)
