"""`--tracing` of the commands that serve (`serve`, `node`): OpenTelemetry spans of their work (rollbox.tracing)."""

from __future__ import annotations

import argparse
import os

from rollbox import tracing


def tracing_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--tracing", choices=tracing.EXPORTERS,
                         help="record OpenTelemetry spans of every request and send them to the OTLP collector of "
                              "OTEL_EXPORTER_OTLP_ENDPOINT, or print them (else OTEL_TRACES_EXPORTER decides; off "
                              "by default; docs/observability.md)")
    return options


def start_tracing(args: argparse.Namespace) -> None:
    """Turns tracing on as asked, before the app is made (its spans are installed then)."""
    if args.tracing and not tracing.on:
        os.environ["OTEL_TRACES_EXPORTER"] = args.tracing  # what this process starts traces too
        tracing.enable(args.tracing)
