"""OpenTelemetry spans of rollbox's work, from a trainer's episode through the router and the node to the sandbox.

Off unless asked, and free when off: every call site tests `tracing.on`, a module attribute, and nothing of
OpenTelemetry is imported until tracing is turned on. It is turned on by `enable()`, by `rollbox serve
--tracing`, or by the standard OTEL_TRACES_EXPORTER variable (`otlp`, `console`, or both, comma-separated)
in the environment of a process that imports rollbox; OTEL_SDK_DISABLED=true keeps it off whatever else says.
The trace context crosses processes as W3C `traceparent` headers (docs/observability.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from rollbox._version import __version__

on = False
"""Whether this process records spans."""
EXPORTERS = ("otlp", "console")
HEADERS = frozenset({b"traceparent", b"tracestate"})
"""What a request carries of its caller's trace (W3C Trace Context)."""
_OFF = contextlib.nullcontext()
_tracer: Any = None
C = TypeVar("C")


def enable(exporter: str | Iterable[str] | None = None) -> None:
    """Turns tracing on in this process.

    `exporter` names where spans go: "otlp" (to the collector the standard OTEL_EXPORTER_OTLP_* variables name;
    http/protobuf to localhost:4318 unless OTEL_EXPORTER_OTLP_PROTOCOL=grpc) or "console" (printed as JSON), or
    both. None keeps the tracer provider the application set up itself. Needs `pip install 'rollbox[otel]'`.
    """
    global on, _tracer
    try:
        from opentelemetry import trace
    except ImportError:
        raise ImportError("tracing needs OpenTelemetry: pip install 'rollbox[otel]'") from None
    names = [exporter] if isinstance(exporter, str) else list(exporter or ())
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        raise ValueError(f"unknown trace exporter {unknown[0]!r}: use {' or '.join(EXPORTERS)}")
    if names:
        _export_to(trace, names)
    _tracer = trace.get_tracer("rollbox", __version__)
    on = True


def _export_to(trace: Any, names: list[str]) -> None:
    """Adds an exporter per name to the application's SDK tracer provider, or to one made here."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "rollbox"}
        provider = TracerProvider(resource=Resource.create(attributes))
        trace.set_tracer_provider(provider)
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    return OTLPSpanExporter()


def from_environment(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER names that rollbox serves (none if OTEL_SDK_DISABLED=true)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    return [name.strip() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip() in EXPORTERS]


def span(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A span of this process's work, current while the block runs (nothing at all when tracing is off)."""
    if not on:
        return _OFF
    return _tracer.start_as_current_span(name, attributes=attributes)


def annotate(attributes: Mapping[str, Any]) -> None:
    """Adds attributes to the current span (call only when `on`)."""
    from opentelemetry import trace

    trace.get_current_span().set_attributes(attributes)


@contextlib.contextmanager
def client_call(call: C, name: str, attributes: Mapping[str, Any]) -> Iterator[C]:
    """A client span around one API call, and the call with the span's context added to its headers."""
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes):
        yield propagated(call)


def propagated(call: C) -> C:
    """The call (a dataclass with `headers`) with the current trace context added to its headers."""
    headers = dict(call.headers or {})  # type: ignore[attr-defined]
    inject(headers)
    return dataclasses.replace(call, headers=headers)  # type: ignore[type-var]


def inject(headers: dict[str, str]) -> None:
    """Adds the current trace context to `headers` (call only when `on`)."""
    from opentelemetry import propagate

    propagate.inject(headers)


def server_span(name: str, headers: Iterable[tuple[bytes, bytes]],
                attributes: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """A server span for one request, the child of its caller's span when its headers carry a trace context. It is
    current while the block runs, and ended by the caller (a streamed answer ends it when its stream does)."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    carrier = {key.decode("latin-1"): value.decode("latin-1") for key, value in headers if key in HEADERS}
    return _tracer.start_as_current_span(name, context=propagate.extract(carrier), kind=SpanKind.SERVER,
                                         attributes=attributes, end_on_exit=False)


def exec_phases(connecting: int, spawned: int | None, ended: int) -> None:
    """Splits a command's time on the current span (the node's exec), in milliseconds: queueing (from the span's
    start until the node reached the sandbox's agent), agent (connecting to it and its fork and exec) and command
    (from the exec to the exit). Times are time.time_ns(); `spawned` is None for a command that never started."""
    from opentelemetry import trace

    current = trace.get_current_span()
    if not current.is_recording():  # a streamed command outlives its request's span
        return
    started = getattr(current, "start_time", None) or connecting
    spawned = ended if spawned is None else spawned
    current.set_attributes({"rollbox.exec.queue_ms": (connecting - started) / 1e6,
                            "rollbox.exec.agent_ms": (spawned - connecting) / 1e6,
                            "rollbox.exec.command_ms": (ended - spawned) / 1e6})


def _enable_from_environment() -> None:
    exporters = from_environment()
    if not exporters:
        return
    try:
        enable(exporters)
    except ImportError as error:  # asked for by the environment, not by this program: say so, and go on untraced
        logging.getLogger("rollbox").warning("OTEL_TRACES_EXPORTER is set, but %s", error)


_enable_from_environment()
