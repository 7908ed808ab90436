"""The report of `scale.py`: one markdown table of W5, W9, the claims and the payloads.

`build_table` makes the rows of each workload (`w5_rows`, `w9_rows`, `claim_rows`,
`payload_rows`), each figure beside its reference and its target ("met" or
"missed": a missed target is reported, not a failure), and the list of failed checks.
"""

from __future__ import annotations

import dataclasses
import time

from benchmarks.report import code_version
from benchmarks.results import MISSING, fmt
from benchmarks.scale_common import (
    CLAIMS_TARGET,
    DRAIN_CELL,
    W5_RATIO_TARGET,
    W9_RATIO_TARGET,
    Measured,
    Results,
    ScaleOptions,
)

# ---------------------------------------------------------------- the table


HEADER = ["workload", "configuration", "metric", "figure", "ratio", "target", "checks / notes"]
METRICS = (("steady", "steady"), ("startup", "incl. start-up"), ("done", "all done in DB"))


def note(result: Measured) -> str:
    problems = result.all_problems()
    text = "; ".join(problems) if problems else "ok: each i once, 0 unfinished"
    pause = result.drain.longest_pause
    return text + (f"; longest pause {fmt(pause)} ms" if pause is not None else "")


def ratio_of(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def alone_share(value: float | None, results: Results) -> str:
    share = ratio_of(value, results.w5_alone)
    return "" if share is None else f"{share * 100:.0f} % of the handler alone"


def verdict(value: float | None, target: float, *, at_most: bool = False) -> str:
    if value is None:
        return MISSING
    met = value <= target if at_most else value >= target
    return "met" if met else "missed"


def w5_rows(options: ScaleOptions, results: Results) -> list[list[str]]:
    rows = []
    if results.w5_alone is not None:
        rows.append(
            [
                "W5 ORM handler alone",
                "1 thread, no queue",
                "all done",
                f"{fmt(results.w5_alone)} jobs/s",
                "",
                "",
                "its `handle` called in a loop: one interpreter's ceiling for this handler",
            ]
        )
    for cell in options.w5_cells:
        noop = results.w5.get((cell.label(), "sink"))
        orm = results.w5.get((cell.label(), "orm"))
        if noop is None or orm is None:
            continue
        for metric, label in METRICS:
            base, value = getattr(noop.drain, metric), getattr(orm.drain, metric)
            share = ratio_of(value, base)
            target = f"ORM ≥ 60 %: {verdict(share, W5_RATIO_TARGET)}"
            rows.append(
                ["W5 no-op", cell.label(), label, f"{fmt(base)} jobs/s", "", "", note(noop)]
            )
            rows.append(
                [
                    "W5 ORM",
                    cell.label(),
                    label,
                    f"{fmt(value)} jobs/s",
                    f"{fmt(None if share is None else share * 100)} % of no-op",
                    target,
                    "; ".join(filter(None, [alone_share(value, results), note(orm)])),
                ]
            )
        limit = 2 * (cell.concurrency or 10) * cell.processes
        for task, result in (("no-op", noop), ("ORM", orm)):
            rows.append(
                [
                    f"W5 {task}",
                    cell.label(),
                    f"sessions opened during the {options.n:,}-job drain",
                    fmt(result.sessions),
                    "",
                    f"≤ {limit}: {verdict(result.sessions, limit, at_most=True)}",
                    "pg_stat_database.sessions after stop minus before spawn, "
                    "the harness's poller excluded",
                ]
            )
    return rows


def w9_rows(options: ScaleOptions, results: Results) -> list[list[str]]:
    cold = scale_rows(f"W9 ({options.w9_n:,} jobs)", results.w9, METRICS)
    warm_metrics = (("steady", "steady"), ("done", "commit to all done in DB"))
    warm = scale_rows(f"W9 warm ({options.w9_n:,} jobs)", results.w9_warm, warm_metrics)
    return cold + warm


def scale_rows(
    workload: str, drains: dict[int, Measured], metrics: tuple[tuple[str, str], ...]
) -> list[list[str]]:
    rows: list[list[str]] = []
    if not drains:
        return rows
    largest = max(drains)
    for metric, label in metrics:
        best = max((getattr(r.drain, metric) or 0.0 for r in drains.values()), default=0.0)
        for processes, result in sorted(drains.items()):
            value = getattr(result.drain, metric)
            cell = dataclasses.replace(DRAIN_CELL, processes=processes)
            share = ratio_of(value, best)
            target = ""
            if processes == largest and metric != "startup":
                target = f"{largest} processes ≥ 80 % of best: {verdict(share, W9_RATIO_TARGET)}"
            rows.append(
                [
                    workload,
                    cell.label(),
                    label,
                    f"{fmt(value)} jobs/s",
                    f"{fmt(None if share is None else share * 100)} % of best",
                    target,
                    note(result)
                    + ("" if result.sessions is None else f"; {fmt(result.sessions)} sessions"),
                ]
            )
    return rows


def claim_rows(options: ScaleOptions, results: Results) -> list[list[str]]:
    rows = []
    for workers, result in sorted(results.claims.items()):
        cell = dataclasses.replace(DRAIN_CELL, processes=workers)
        problems = (
            "; ".join(result.problems)
            if result.problems
            else f"ok: each i once, 0 unfinished, count validated ({result.busy.taking} claims "
            f"took a job = {result.jobs} enqueues)"
        )
        detail = (
            f"{problems}; {result.busy.claims} claims in "
            f"{options.claim_window:.1f} s with "
            f"{result.jobs} enqueues {options.claim_interval * 1000:.0f} ms apart, "
            f"{result.idle.claims} in an idle {options.claim_window:.1f} s; "
            f"{result.commits_per_enqueue:.1f} transactions committed per enqueue "
            "(xact_commit, idle subtracted, the enqueue's own included)"
        )
        target = (
            f"≤ 2 with 8 workers: {verdict(result.per_enqueue, CLAIMS_TARGET, at_most=True)}"
            if workers == 8
            else "— (one worker: the floor)"
        )
        rows.append(
            [
                "W9 claims",
                cell.label() + ", idle",
                "claim statements per enqueue",
                f"{result.per_enqueue:.2f}",
                "",
                target,
                detail,
            ]
        )
    return rows


def payload_rows(results: Results) -> list[list[str]]:
    rows = []
    base = results.payload.get("sink")
    for task, result in results.payload.items():
        label = "int (`bench.sink`)" if task == "sink" else "8 fields (`bench.rich`)"
        values = [
            ("W1b", "enqueue_many, 1 transaction", result.enqueue_rate, base and base.enqueue_rate)
        ]
        values += [
            (
                "W2",
                f"{DRAIN_CELL.label()}: {text}",
                getattr(result.drain, metric),
                base and getattr(base.drain, metric),
            )
            for metric, text in METRICS
            if metric != "startup"
        ]
        for workload, metric, value, reference in values:
            share = ratio_of(value, reference)
            rows.append(
                [
                    f"{workload} payload",
                    label,
                    metric,
                    f"{fmt(value)} jobs/s",
                    f"{fmt(None if share is None else share * 100)} % of int",
                    "",
                    note(result) if workload == "W2" else "",
                ]
            )
    return rows


def build_table(options: ScaleOptions, results: Results) -> tuple[str, list[str]]:
    failures = [
        f"W5 {task} {label}: {p}"
        for (label, task), r in results.w5.items()
        for p in r.all_problems()
    ]
    failures += [f"W9 {k} processes: {p}" for k, r in results.w9.items() for p in r.all_problems()]
    failures += [
        f"W9 warm {k} processes: {p}" for k, r in results.w9_warm.items() for p in r.all_problems()
    ]
    failures += [f"claims {k} workers: {p}" for k, r in results.claims.items() for p in r.problems]
    failures += [f"payload {k}: {p}" for k, r in results.payload.items() for p in r.all_problems()]
    rows = w5_rows(options, results) + w9_rows(options, results)
    rows += claim_rows(options, results) + payload_rows(results)
    lines = ["| " + " | ".join(HEADER) + " |", "|---|---|---|---:|---:|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    title = (
        f"django-venturi scale workloads (issue #17), N = {options.n:,}, W9 N = "
        f"{options.w9_n:,}{' (quick)' if options.quick else ''}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    return f"### {title}\n\n{code_version()}\n\n" + "\n".join(lines) + "\n", failures
