"""The report of `run.py`: the markdown table and its checks, and the chart.

`build_table` turns the records of every repetition into one table (W4 first, then
venturi's W1 to W3, W7, W6 and W8) and the list of failed checks; `best_cell` picks
W2b's best cell, which W3 measures again; `draw_chart` draws the PNG (`chart.py`);
`code_version` names the commit measured (`scale.py`'s table shows it too). The
PgQueuer summary and comparison table printed above the table are `compare.py`'s.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Sequence

from benchmarks import chart
from benchmarks import peer_pgqueuer as pgq
from benchmarks.config import DEFAULTS, LIMIT_DRAINS, REPO_ROOT, W6_CELL, Options
from benchmarks.harness import log
from benchmarks.results import MISSING, Drain, Record, fmt

# ---------------------------------------------------------------- the table


def best_cell(records: list[Record]) -> str | None:
    """The W2b cell with the highest mean "all done in DB" rate (the speed issue's metric)."""
    keys = [key for key in records[0].drains if key.startswith("w2b:")]
    if not keys:
        return None

    def score(key: str) -> float:
        return mean([r.drains[key].done for r in records if key in r.drains]) or 0.0

    return max(keys, key=score)


def mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def figure(values: Sequence[float | None], digits: int = 0) -> str:
    """The median (with two runs: their mean, then both values)."""
    present = [v for v in values if v is not None]
    if not present:
        return MISSING
    if len(present) == 1:
        return fmt(present[0], digits)
    centre = statistics.fmean(present) if len(present) == 2 else statistics.median(present)
    runs = ", ".join(fmt(v, digits) for v in present)
    return f"{fmt(centre, digits)} ({runs})"


def centre(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.fmean(present) if len(present) <= 2 else statistics.median(present)


def ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return MISSING
    return f"{value / reference:.2f}"


def build_table(options: Options, records: list[Record]) -> tuple[str, list[str]]:
    rows: list[list[str]] = []
    failures: list[str] = []
    n = options.n

    def enqueue_row(workload: str, config: str, key: str, ref_key: str, note: str = "") -> None:
        values = [r.enqueue.get(key) for r in records]
        if all(v is None for v in values):
            return
        reference = centre([r.enqueue.get(ref_key) for r in records])
        rows.append(
            [
                workload,
                config,
                "enqueue",
                f"{figure(values)} jobs/s",
                ratio(centre(values), reference),
                note,
            ]
        )

    def drain_rows(workload: str, config: str, key: str, references: dict[str, float | None]):
        results = [r.drains[key] for r in records if key in r.drains]
        if not results:
            return
        problems = sorted({p for result in results for p in result.problems()})
        for problem in problems:
            failures.append(f"{workload} {config}: {problem}")
        pauses = ", ".join(fmt(result.longest_pause) for result in results)
        note = "; ".join(problems) if problems else "ok: each i once, 0 unfinished"
        note += f"; longest pause {pauses} ms"
        for metric, label in (
            ("steady", "steady"),
            ("startup", "incl. start-up"),
            ("done", "all done in DB"),
        ):
            values = [getattr(result, metric) for result in results]
            rows.append(
                [
                    workload,
                    config,
                    label,
                    f"{figure(values)} jobs/s",
                    ratio(centre(values), references.get(metric)),
                    note,
                ]
            )

    def wake_rows(workload: str, config: str, key: str, reference_key: str) -> None:
        results = [r.wakes[key] for r in records if key in r.wakes]
        if not results:
            return
        refs = [r.wakes[reference_key] for r in records if reference_key in r.wakes]
        problems = sorted({p for result in results for p in result.problems()})
        for problem in problems:
            failures.append(f"{workload} {config}: {problem}")
        received = ", ".join(f"{result.received}/{result.count}" for result in results)
        note = "; ".join(problems) if problems else f"received {received}"
        for metric in ("p50", "p95", "p99", "max"):
            values = [getattr(result, metric) for result in results]
            reference = centre([getattr(ref, metric) for ref in refs])
            rows.append(
                [
                    workload,
                    config,
                    metric,
                    f"{figure(values, 1)} ms",
                    ratio(centre(values), reference),
                    note,
                ]
            )

    # The limit: per metric, the better of batch100 with 1 and 2 processes.
    batch_keys = [f"limit_batch100x{p}" for m, p in LIMIT_DRAINS if m == "batch100"]
    limit_best: dict[str, float | None] = {}
    for metric in ("steady", "startup", "done"):
        candidates = [
            centre([getattr(r.drains[key], metric) for r in records if key in r.drains])
            for key in batch_keys
        ]
        present = [c for c in candidates if c is not None]
        limit_best[metric] = max(present) if present else None

    bulk_note = records[0].notes.get("bulk", "")
    enqueue_row("W4 W1", "psycopg INSERT+NOTIFY, autocommit", "limit_single", "limit_single")
    enqueue_row("W4 W1b", "psycopg INSERT ... unnest(), 1 statement", "limit_bulk", "limit_bulk")
    for mode, processes in LIMIT_DRAINS:
        key = f"limit_{mode}x{processes}"
        plural = "es" if processes > 1 else ""
        drain_rows("W4 W2", f"{mode}, {processes} process{plural}", key, limit_best)
    wake_rows("W4 W3", "claim1, 1 process", "limit_claim1x1", "limit_claim1x1")

    enqueue_row("W1", "`SinkJob(i=i).enqueue()`, autocommit", "single", "limit_single")
    enqueue_row("W1b", "`venturi.enqueue_many([...])`", "bulk", "limit_bulk", bulk_note)
    drain_rows("W2a", DEFAULTS.label(), "w2a", limit_best)
    best = best_cell(records)
    for key in records[0].drains:
        if key.startswith("w2b:"):
            drain_rows("W2b", key.removeprefix("w2b:"), key, limit_best)
    if best is not None:
        drain_rows("W2b best", best.removeprefix("w2b:"), best, limit_best)
    for key in records[0].wakes:
        if not key.startswith(("limit_", "pgq_")):
            workload = "W3 (W2a config)" if key.startswith("default:") else "W3 (W2b best)"
            wake_rows(workload, key.split(":", 1)[1], key, "limit_claim1x1")

    dedups = [r.dedup for r in records if r.dedup is not None]
    if dedups:
        problems = sorted({p for result in dedups for p in result.problems()})
        for problem in problems:
            failures.append(f"W7: {problem}")
        first = dedups[0]
        config = (
            f"{first.producers} processes x {first.per_producer:,} `CountJob(key=i % "
            f"{first.keys}).enqueue()`, autocommit, `Merge.update` (count + 1)"
        )
        values = [result.rate for result in dedups]
        reference = centre([r.enqueue.get("single") for r in records])
        rate = centre(values)
        shown = ratio(rate, reference) if reference else "\u2014"
        if problems:
            note = "; ".join(problems)
        else:
            live = ", ".join(str(result.live) for result in dedups)
            sums = ", ".join(f"{result.count_sum:,}" for result in dedups)
            note = f"ok: {live} live jobs, sum of count {sums}"
        seconds = ", ".join(fmt(result.elapsed, 2) for result in dedups)
        note += f"; {first.total:,} enqueues in {seconds} s"
        note += "; ratio to W1 single enqueue" if reference else "; no W1 in this run"
        rows.append(["W7", config, "enqueue", f"{figure(values)} enqueues/s", shown, note])

    backlog_rows(options, records, rows, failures)
    memory_rows(records, rows, failures)

    header = ["workload", "configuration", "metric", "figure", "ratio to W4", "checks / notes"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * 2 + ["---"]) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    runs = len(records)
    title = (
        f"django-venturi benchmarks, N = {n:,}, {runs} run{'s' if runs > 1 else ''}"
        f"{' (quick)' if options.quick else ''}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    text = f"### {title}\n\n{code_version()}\n\n" + "\n".join(lines) + "\n"
    return text, failures


def backlog_rows(
    options: Options, records: list[Record], rows: list[list[str]], failures: list[str]
) -> None:
    """W6: one row per case and metric; the ratio is to the 10k case (flat = 1.00)."""
    results = {
        key: r.drains[f"w6:{key}"]
        for key, _, _ in options.w6_cases
        for r in records
        if f"w6:{key}" in r.drains
    }
    if not results:
        return
    first_key = options.w6_cases[0][0]
    reference = results.get(first_key)
    for key, state, count in options.w6_cases:
        result = results.get(key)
        if result is None:
            continue
        problems = result.problems()
        failures.extend(f"W6 {key}: {problem}" for problem in problems)
        others = "ready, due in 1 day" if state == "ready" else "finished (completed)"
        config = f"{options.w6_target:,} jobs beside {count:,} {others}; {W6_CELL.label()}"
        note = "; ".join(problems) if problems else "ok: each i once, 0 unfinished"
        build = next((r.notes[f"w6:{key}"] for r in records if f"w6:{key}" in r.notes), "")
        note += f"; {build}; ratio to the {options.w6_cases[0][2]:,} case (1.00 = flat)"
        for metric, label in (("steady", "steady"), ("flow", "first entry to all done in DB")):
            value = getattr(result, metric)
            base = getattr(reference, metric) if reference is not None else None
            rows.append(["W6", config, label, f"{fmt(value)} jobs/s", ratio(value, base), note])


def memory_rows(records: list[Record], rows: list[list[str]], failures: list[str]) -> None:
    """W8: RSS after the warm-up, after all jobs, and the growth."""
    memory = next((r.memory for r in records if r.memory is not None), None)
    if memory is None:
        return
    problems = memory.problems()
    failures.extend(f"W8: {problem}" for problem in problems)
    config = (
        f"{W6_CELL.label()}; {memory.warmup:,} warm-up jobs, then {memory.jobs:,} "
        "(`enqueue_many`, one transaction)"
    )
    series = ", ".join(f"{kb / 1024:.1f}" for _, kb in memory.samples)
    note = "; ".join(problems) if problems else "ok"
    note += (
        f"; VmRSS every {memory.samples[1][0]:,} jobs: {series} MB"
        if len(memory.samples) > 1
        else ""
    )
    start = memory.samples[0][1] / 1024 if memory.samples else None
    end = memory.samples[-1][1] / 1024 if memory.samples else None
    rows.append(["W8", config, "RSS after warm-up", f"{fmt(start, 1)} MB", "\u2014", note])
    rows.append(
        ["W8", config, f"RSS after {memory.jobs:,} more", f"{fmt(end, 1)} MB", "\u2014", note]
    )
    rows.append(["W8", config, "RSS growth", f"{fmt(memory.growth_mb, 1)} MB", "\u2014", note])


def draw_chart(options: Options, records: list[Record], title: str) -> None:
    """The PNG of the W2 throughputs and W3 latencies (needs matplotlib, the `bench` extra)."""
    if options.chart is None:
        return
    if not chart.available():
        log("no chart: matplotlib is not installed (pip install -e '.[bench]')")
        return
    drains: list[tuple[str, list[Drain]]] = []
    for mode, processes in LIMIT_DRAINS:
        key = f"limit_{mode}x{processes}"
        results = [r.drains[key] for r in records if key in r.drains]
        if results:
            drains.append(
                (f"W4 {mode}, {processes} process{'es' if processes > 1 else ''}", results)
            )
    for key in records[0].drains:
        if key == "w2a" or key.startswith("w2b:"):
            label = "W2a " + DEFAULTS.label() if key == "w2a" else "W2b " + key[4:]
            drains.append((label, [r.drains[key] for r in records if key in r.drains]))
    for key in records[0].drains:
        if key == "pgq_w2a" or key.startswith("pgq_w2b:"):
            cell = pgq.PGQ_DEFAULTS.label() if key == "pgq_w2a" else key[8:]
            label = f"PgQueuer {'W2a' if key == 'pgq_w2a' else 'W2b'} {cell}"
            drains.append((label, [r.drains[key] for r in records if key in r.drains]))
    wakes: list[tuple[str, list[float]]] = []
    for key in records[0].wakes:
        latencies = [t for r in records if key in r.wakes for t in r.wakes[key].latencies]
        if key.startswith("limit_"):
            label = "W4 claim1, 1 process"
        elif key.startswith("pgq_"):
            label = "PgQueuer W3 " + ("defaults" if key.startswith("pgq_default:") else "W2b best")
        else:
            label = ("W3 defaults" if key.startswith("default:") else "W3 W2b best: ") + (
                "" if key.startswith("default:") else key.split(":", 1)[1]
            )
        wakes.append((label, latencies))
    if not drains and not wakes:
        return
    chart.draw(options.chart, title=title, n=options.n, drains=drains, wakes=wakes)
    log(f"chart: {options.chart}")


def code_version() -> str:
    """The commit measured, and whether django_venturi/ differs from it."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "code: not a git checkout"
    dirty = git("status", "--porcelain", "--", "django_venturi").splitlines()
    if dirty:
        return f"code: {commit}, plus uncommitted changes to {len(dirty)} django_venturi/ file(s)"
    return f"code: {commit}"
