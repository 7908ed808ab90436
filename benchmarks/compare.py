"""venturi beside its peers: the summary block and the comparison table of `run.py`.

Every figure is the median over the rounds (the mean with two), followed by the
per-round values. `venturi ÷ PgQueuer` is the plain ratio of the two figures: for
throughput above 1 means venturi is faster; for latency (lower is better) below 1
means venturi is faster. The ratios to W4 (the hand-written psycopg limit of the same
run) are for information.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

MISSING = "n/a"
DRAIN_METRICS = (("steady", "steady"), ("startup", "incl. start-up"), ("done", "all done in DB"))
WAKE_METRICS = ("p50", "p95", "p99", "max")
LIMIT_BATCH = ("limit_batch100x1", "limit_batch100x2")
LIMIT_WAKE = "limit_claim1x1"


def centre(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.fmean(present) if len(present) <= 2 else statistics.median(present)


def fmt(value: float | None, digits: int = 0) -> str:
    return MISSING if value is None else f"{value:,.{digits}f}"


def figure(values: Sequence[float | None], digits: int = 0) -> str:
    """The median (two runs: the mean), then every round's value."""
    present = [v for v in values if v is not None]
    if len(present) <= 1:
        return fmt(present[0] if present else None, digits)
    runs = ", ".join(fmt(v, digits) for v in values)
    return f"{fmt(centre(present), digits)} ({runs})"


def ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return MISSING
    return f"{value / reference:.2f}"


def processes(key: str) -> int:
    """The process count of a cell key such as `w2b:2 processes, concurrency 128, ...`."""
    return int(key.split(":", 1)[1].split()[0])


def best_key(
    records: Sequence[Any], prefix: str, metric: str, max_processes: int | None = None
) -> str | None:
    """The drain key under `prefix` with the highest mean `metric` over the rounds."""
    keys = {key for record in records for key in record.drains if key.startswith(prefix)}
    if max_processes is not None:
        keys = {key for key in keys if processes(key) <= max_processes}

    def score(key: str) -> float:
        values = [getattr(r.drains[key], metric) for r in records if key in r.drains]
        return centre(values) or 0.0

    return max(sorted(keys), key=score) if keys else None


def only_key(records: Sequence[Any], prefix: str) -> str | None:
    return next((key for r in records for key in r.drains if key.startswith(prefix)), None)


@dataclasses.dataclass
class Comparison:
    """The rows of the comparison table and the failed checks of the peer's cells."""

    records: Sequence[Any]
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    def drain_values(self, key: str | None, metric: str) -> list[float | None]:
        if key is None:
            return []
        return [getattr(r.drains[key], metric) for r in self.records if key in r.drains]

    def wake_values(self, key: str | None, metric: str) -> list[float | None]:
        if key is None:
            return []
        return [getattr(r.wakes[key], metric) for r in self.records if key in r.wakes]

    def enqueue_values(self, key: str) -> list[float | None]:
        return [r.enqueue.get(key) for r in self.records if key in r.enqueue]

    def limit_drain(self, metric: str) -> float | None:
        figures = [centre(self.drain_values(key, metric)) for key in LIMIT_BATCH]
        present = [f for f in figures if f is not None]
        return max(present) if present else None

    def add(
        self,
        workload: str,
        metric: str,
        venturi: list[float | None],
        peer: list[float | None],
        limit: float | None,
        *,
        unit: str,
        digits: int = 0,
        note: str = "",
    ) -> None:
        if not venturi and not peer:
            return
        v, p = centre(venturi), centre(peer)
        self.rows.append(
            [
                workload,
                metric,
                f"{figure(venturi, digits)} {unit}",
                f"{figure(peer, digits)} {unit}",
                ratio(v, p),
                ratio(v, limit),
                ratio(p, limit),
                note,
            ]
        )

    def check(self, workload: str, key: str | None, kind: str) -> str:
        """Collect the problems of a cell's rounds; return the checks note."""
        if key is None:
            return ""
        table = "drains" if kind == "drain" else "wakes"
        results = [getattr(r, table)[key] for r in self.records if key in getattr(r, table)]
        problems = sorted({p for result in results for p in result.problems()})
        self.failures.extend(f"{workload} {key}: {problem}" for problem in problems)
        if problems:
            return "; ".join(problems)
        if kind == "drain":
            return "ok: each i once, 0 unfinished"
        return "received " + ", ".join(f"{w.received}/{w.count}" for w in results)


def label(key: str | None) -> str:
    return key.split(":", 1)[1] if key and ":" in key else MISSING


def drain_block(
    c: Comparison, workload: str, venturi: str | None, peer: str | None, *, limit: bool = True
) -> None:
    """Three rows (steady, incl. start-up, all done); `limit=False`: no W4 of that size ran."""
    notes = "; ".join(
        filter(
            None,
            [
                f"venturi: {label(venturi) if venturi != 'w2a' else 'defaults'}" if venturi else "",
                f"PgQueuer: {label(peer) if peer != 'pgq_w2a' else 'defaults'}" if peer else "",
                f"venturi {c.check(workload, venturi, 'drain')}" if venturi else "",
                f"PgQueuer {c.check(workload, peer, 'drain')}" if peer else "",
            ],
        )
    )
    for metric, name in DRAIN_METRICS:
        c.add(
            workload,
            name,
            c.drain_values(venturi, metric),
            c.drain_values(peer, metric),
            c.limit_drain(metric) if limit else None,
            unit="jobs/s",
            note=notes,
        )


def best_block(c: Comparison, workload: str, metric: str, name: str) -> None:
    """The best <= 2-process W2b cell of each for one metric (each chosen on that metric)."""
    venturi = best_key(c.records, "w2b:", metric, max_processes=2)
    peer = best_key(c.records, "pgq_w2b:", metric, max_processes=2)
    note = f"venturi: {label(venturi)}; PgQueuer: {label(peer)}"
    c.add(
        workload,
        name,
        c.drain_values(venturi, metric),
        c.drain_values(peer, metric),
        c.limit_drain(metric),
        unit="jobs/s",
        note=note,
    )


def wake_block(c: Comparison, workload: str, venturi: str | None, peer: str | None) -> None:
    reference = LIMIT_WAKE
    notes = (
        f"venturi: {label(venturi)}, {c.check(workload, venturi, 'wake')}; "
        f"PgQueuer: {label(peer)}, {c.check(workload, peer, 'wake')}; "
        "lower is better: a ratio below 1 means venturi is faster"
    )
    for metric in WAKE_METRICS:
        c.add(
            workload,
            f"{metric} (lower is better)",
            c.wake_values(venturi, metric),
            c.wake_values(peer, metric),
            centre(c.wake_values(reference, metric)),
            unit="ms",
            digits=1,
            note=notes,
        )


def wake_key(records: Sequence[Any], prefix: str) -> str | None:
    return next((key for r in records for key in r.wakes if key.startswith(prefix)), None)


def table_rows(c: Comparison, options: Any) -> None:
    limit_single = centre(c.enqueue_values("limit_single"))
    limit_bulk = centre(c.enqueue_values("limit_bulk"))
    pgq_bulk_note = next((r.notes["pgq_bulk"] for r in c.records if "pgq_bulk" in r.notes), "")
    c.add(
        "W1 single enqueue",
        "enqueue",
        c.enqueue_values("single"),
        c.enqueue_values("pgq_single"),
        limit_single,
        unit="jobs/s",
        note="venturi `SinkJob(i=i).enqueue()`; PgQueuer `Queries.enqueue('noop', b'i')`; "
        "both autocommit, one transaction per job",
    )
    c.add(
        "W1b bulk enqueue",
        "enqueue",
        c.enqueue_values("bulk"),
        c.enqueue_values("pgq_bulk"),
        limit_bulk,
        unit="jobs/s",
        note=f"venturi `enqueue_many` in one transaction; PgQueuer: {pgq_bulk_note}",
    )
    has = {key for r in c.records for key in r.drains}
    drain_block(
        c, "W2a defaults", "w2a" if "w2a" in has else None, "pgq_w2a" if "pgq_w2a" in has else None
    )
    c.add(
        "Start-up (W2a defaults)",
        "spawn to first handler entry (lower is better)",
        c.drain_values("w2a" if "w2a" in has else None, "first_entry"),
        c.drain_values("pgq_w2a" if "pgq_w2a" in has else None, "first_entry"),
        centre(c.drain_values("limit_claim1x1", "first_entry")),
        unit="ms",
        note="W4 reference: claim1, 1 process",
    )
    best_block(c, "W2b best <= 2 processes", "steady", "steady")
    best_block(c, "W2b best <= 2 processes", "startup", "incl. start-up")
    best_block(c, "W2b best <= 2 processes", "done", "all done in DB")
    drain_block(
        c,
        f"W2c {options.w2c_n:,} jobs",
        only_key(c.records, "w2c:"),
        only_key(c.records, "pgq_w2c:"),
        limit=False,
    )
    wake_block(
        c, "W3 wake, defaults", wake_key(c.records, "default:"), wake_key(c.records, "pgq_default:")
    )
    wake_block(
        c, "W3 wake, W2b best", wake_key(c.records, "best:"), wake_key(c.records, "pgq_best:")
    )


def headline(
    what: str,
    venturi: float | None,
    peer: float | None,
    unit: str,
    *,
    digits: int = 0,
    lower_is_better: bool = False,
    extra: str = "",
) -> str:
    sense = " (lower is better: below 1, venturi is faster)" if lower_is_better else ""
    return (
        f"- **{what}**: venturi {fmt(venturi, digits)} {unit}, PgQueuer {fmt(peer, digits)} "
        f"{unit}: venturi ÷ PgQueuer **{ratio(venturi, peer)}**{sense}{extra}"
    )


def summary(c: Comparison, options: Any) -> list[str]:
    lines: list[str] = []

    def best(metric: str) -> tuple[float | None, float | None, str]:
        venturi = best_key(c.records, "w2b:", metric, max_processes=2)
        peer = best_key(c.records, "pgq_w2b:", metric, max_processes=2)
        cells = f" ({label(venturi)} vs {label(peer)})"
        return centre(c.drain_values(venturi, metric)), centre(c.drain_values(peer, metric)), cells

    v, p, cells = best("steady")
    lines.append(headline("Steady drain, best <= 2 processes", v, p, "jobs/s", extra=cells))
    big_v, big_p = only_key(c.records, "w2c:"), only_key(c.records, "pgq_w2c:")
    lines.append(
        headline(
            f"All done in DB, {options.w2c_n:,} jobs, best <= 2 processes (W2c)",
            centre(c.drain_values(big_v, "done")),
            centre(c.drain_values(big_p, "done")),
            "jobs/s",
            extra=f" ({label(big_v)} vs {label(big_p)})",
        )
    )
    v, p, cells = best("done")
    lines.append(
        headline(
            f"All done in DB, {options.n:,} jobs, best <= 2 processes", v, p, "jobs/s", extra=cells
        )
    )
    lines.append(
        headline(
            "Defaults (W2a), steady",
            centre(c.drain_values("w2a", "steady")),
            centre(c.drain_values("pgq_w2a", "steady")),
            "jobs/s",
        )
    )
    lines.append(
        headline(
            "Start-up, spawn to first handler entry (defaults)",
            centre(c.drain_values("w2a", "first_entry")),
            centre(c.drain_values("pgq_w2a", "first_entry")),
            "ms",
            lower_is_better=True,
        )
    )
    wv, wp = wake_key(c.records, "default:"), wake_key(c.records, "pgq_default:")
    for metric in ("p50", "p99"):
        lines.append(
            headline(
                f"Wake latency {metric} (defaults)",
                centre(c.wake_values(wv, metric)),
                centre(c.wake_values(wp, metric)),
                "ms",
                digits=1,
                lower_is_better=True,
            )
        )
    limit = centre(c.enqueue_values("limit_single"))
    v, p = centre(c.enqueue_values("single")), centre(c.enqueue_values("pgq_single"))
    lines.append(
        headline(
            "Single enqueue (W1)",
            v,
            p,
            "jobs/s",
            extra=f"; ÷ W4: venturi {ratio(v, limit)}, PgQueuer {ratio(p, limit)}",
        )
    )
    v, p = centre(c.enqueue_values("bulk")), centre(c.enqueue_values("pgq_bulk"))
    lines.append(headline("Bulk enqueue (W1b)", v, p, "jobs/s"))
    return lines


def build(options: Any, records: Sequence[Any]) -> tuple[str, list[str]]:
    """The summary block and the comparison table (markdown), and the peer's failed checks."""
    c = Comparison(records)
    table_rows(c, options)
    header = [
        "workload",
        "metric",
        "venturi",
        "PgQueuer",
        "venturi ÷ PgQueuer",
        "venturi ÷ W4",
        "PgQueuer ÷ W4",
        "configuration / checks",
    ]
    lines = [
        f"### venturi vs PgQueuer {peer_version()}, N = {options.n:,}, "
        f"{len(records)} alternating round{'s' if len(records) > 1 else ''}",
        "",
        "Figures: median of the rounds (mean of two), then each round's value.",
        "",
        *summary(c, options),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * 5 + ["---"]) + "|",
        *("| " + " | ".join(row) + " |" for row in c.rows),
        "",
    ]
    return "\n".join(lines), c.failures


def peer_version() -> str:
    try:
        from importlib.metadata import version

        return version("pgqueuer")
    except Exception:  # only a label
        return ""
