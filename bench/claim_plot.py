"""The claim phases of bench/server.py as latency distributions: what a table's p50 and p99 leave out."""

from __future__ import annotations

from pathlib import Path

TARGETS_MS = {"p50 target": 5.0, "p99 target": 25.0}
"""The 64-client warm claim's targets, drawn as lines."""


def plot_claims(curves: dict[str, tuple[str, list[float]]], path: Path, title: str) -> None:
    """One panel per client of the fraction of claims answered within each latency, a line per phase.

    `curves` maps a figure's name (ending in its client: `_raw`, `_sdk`) to its legend label and its samples in
    milliseconds; the HTTP floor's (`http_floor_*`, raw client only) are drawn in both panels, as the baseline."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: .venv/bin/pip install 'rollbox[rl]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    clients = sorted({name.rpartition("_")[2] for name in curves})
    colours = {label: f"C{i}" for i, label in enumerate(dict.fromkeys(label for label, _ in curves.values()))}
    figure, panels = pyplot.subplots(1, len(clients), figsize=(6 * len(clients), 4.5), sharey=True, squeeze=False)
    for panel, client in zip(panels[0], clients, strict=True):
        for name, (label, samples) in curves.items():
            floor = name.startswith("http_floor")
            if not samples or not (name.endswith(f"_{client}") or floor):
                continue
            ordered = sorted(samples)
            fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
            panel.step(ordered, fractions, where="post", label=label, color=colours[label],
                       linestyle="--" if floor else "-")
        for text, value in TARGETS_MS.items():
            panel.axvline(value, color="grey", linewidth=0.8, linestyle=":")
            panel.annotate(text, (value, 0.02), rotation=90, fontsize=7, color="grey")
        panel.set_xscale("log")
        panel.set_xlabel("claim latency, ms (log scale)")
        panel.set_title(client)
        panel.grid(True, which="both", alpha=0.3)
    panels[0][0].set_ylabel("fraction of claims answered")
    legend = {}
    for panel in panels[0]:
        legend.update(zip(*reversed(panel.get_legend_handles_labels()), strict=True))
    figure.legend(legend.values(), legend.keys(), loc="lower center", ncol=4, fontsize=8, frameon=False)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
