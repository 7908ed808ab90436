"""The chart of a run: drain throughput per configuration beside the limit, and wake latency.

Needs matplotlib (the `bench` extra: `pip install -e ".[bench]"`); without it
`run.py` prints the table and says it drew no chart.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _centre(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.fmean(present) if len(present) <= 2 else statistics.median(present)


def colour(label: str) -> str:
    """Grey for the W4 limit, orange for the PgQueuer peer, blue for venturi."""
    if label.startswith("W4"):
        return "#8c8c8c"
    if label.startswith("PgQueuer"):
        return "#e07b24"
    return "#2f6db3"


def draw(
    path: Path,
    *,
    title: str,
    n: int,
    drains: list[tuple[str, list[Any]]],
    wakes: list[tuple[str, list[float]]],
) -> None:
    """Write a PNG: one bar per drain configuration, one latency curve per W3 configuration.

    `drains`: (label, [Drain per run]) in display order, the W4 limit rows first
    (their labels start with "W4"), PgQueuer's ("PgQueuer ...") after venturi's.
    `wakes`: (label, every latency in ms, all runs pooled).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(
        1, 2, figsize=(14, 0.42 * max(len(drains), 8) + 1.6), width_ratios=(1.25, 1)
    )
    labels = [label for label, _ in drains]
    done = [_centre([d.done for d in results]) or 0.0 for _, results in drains]
    positions = list(range(len(drains)))[::-1]
    colours = [colour(label) for label in labels]
    left.barh(positions, done, color=colours, height=0.6)
    limit = max(
        (d for label, d in zip(labels, done, strict=True) if label.startswith("W4")), default=0
    )
    if limit:
        left.axvline(limit, color="#555555", linestyle="--", linewidth=1)
        left.text(limit, len(drains) - 0.4, " W4 limit", color="#555555", va="bottom", fontsize=8)
    for position, value in zip(positions, done, strict=True):
        left.text(value, position, f" {value:,.0f}", va="center", fontsize=8)
    left.set_yticks(positions, labels, fontsize=8)
    left.set_xlabel(
        "jobs/s, start-up included (blue: venturi, orange: PgQueuer, grey: psycopg limit)"
    )
    left.set_title(f"W2 drain, {n:,} jobs: all done in DB", fontsize=10)
    left.set_xlim(0, max([*done, 1.0]) * 1.18)

    for label, latencies in wakes:
        if not latencies:
            continue
        ordered = sorted(latencies)
        fractions = [(k + 1) / len(ordered) for k in range(len(ordered))]
        p50 = statistics.median(ordered)
        right.step(
            ordered,
            fractions,
            where="post",
            label=f"{label} (p50 {p50:.1f} ms)",
            linestyle="--" if label.startswith("PgQueuer") else "-",
        )
    right.set_xscale("log")
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ticks = [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    right.xaxis.set_major_locator(FixedLocator(ticks))
    right.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    right.xaxis.set_minor_formatter(NullFormatter())
    right.set_xlabel("ms from the enqueue's commit to handler entry (log scale)")
    right.set_ylabel("fraction of jobs")
    right.set_title("W3 wake latency (cumulative)", fontsize=10)
    for q in (0.5, 0.99):
        right.axhline(q, color="#bbbbbb", linewidth=0.8, linestyle=":")
    right.legend(loc="lower right", fontsize=7)
    right.grid(True, which="both", axis="x", alpha=0.3)

    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
