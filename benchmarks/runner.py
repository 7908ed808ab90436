"""The runner: one invocation of `run.py`, from its options to the table and its files.

The rounds of W1, W1b and W2 (venturi, each peer and the W4 limit, in an order that
rotates every round) with W7, and W6 and W8 once; then W2c and W3 in rounds that
rotate the same way; then the table (`report.py`, after PgQueuer's comparison from
`compare.py`), printed and written to `Options.output` with the raw figures beside
it (`.json`), and the chart.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable

from benchmarks import compare
from benchmarks import peer_pgqueuer as pgq
from benchmarks.backlog import run_venturi_backlog
from benchmarks.config import DEFAULTS, WORK_DIR, Options
from benchmarks.dedup import run_venturi_dedup
from benchmarks.drains import (
    run_limit,
    run_pgq_bulk,
    run_pgq_single,
    run_pgq_w2c,
    run_venturi_bulk,
    run_venturi_single,
    run_venturi_w2c,
    w2c_cells,
)
from benchmarks.harness import log
from benchmarks.latency import run_limit_wake, run_pgq_wake, run_venturi_wake
from benchmarks.memory import run_venturi_memory
from benchmarks.report import best_cell, build_table, draw_chart
from benchmarks.results import Record

# ---------------------------------------------------------------- rounds


Side = Callable[[Options, Record], None]


def rotated(sides: list[Side], run: int) -> list[Side]:
    """Round r starts with side r: venturi, pgqueuer, w4; then pgqueuer, w4, venturi; ..."""
    if not sides:
        return sides
    shift = run % len(sides)
    return sides[shift:] + sides[:shift]


def drain_sides(options: Options) -> list[Side]:
    """One round of W1, W1b and W2: venturi, then each peer, then the W4 limit."""
    sides: list[Side] = []

    def venturi(o: Options, r: Record) -> None:
        if o.workloads & {"w1", "w2a"}:
            run_venturi_single(o, r)
        if o.workloads & {"w1b", "w2b"}:
            run_venturi_bulk(o, r)

    def pgqueuer(o: Options, r: Record) -> None:
        if o.workloads & {"w1", "w2a"}:
            run_pgq_single(o, r)
        if o.workloads & {"w1b", "w2b"}:
            run_pgq_bulk(o, r)

    sides.append(venturi)
    if "pgqueuer" in options.peers:
        sides.append(pgqueuer)
    if "w4" in options.workloads:
        sides.append(run_limit)
    return sides


def wake_sides(options: Options, records: list[Record]) -> list[Side]:
    """One round of W3: venturi's defaults and W2b best, the peer's, and W4 claim1."""
    w3_cells = {"default": DEFAULTS}
    best = best_cell(records)
    if best is not None:
        w3_cells["best"] = next(c for c in options.grid if c.label() == best[4:])
    pgq_cells = {"default": pgq.PGQ_DEFAULTS}
    pgq_best = compare.best_key(records, "pgq_w2b:", "done")
    if pgq_best is not None:
        pgq_cells["best"] = next(c for c in options.pgq_grid if f"pgq_w2b:{c.label()}" == pgq_best)
    sides: list[Side] = [lambda o, r: run_venturi_wake(o, r, w3_cells)]
    if "pgqueuer" in options.peers:
        sides.append(lambda o, r: run_pgq_wake(o, r, pgq_cells))
    if "w4" in options.workloads:
        sides.append(run_limit_wake)
    return sides


# ---------------------------------------------------------------- one invocation


def run_suite(options: Options) -> int:
    """Run the workloads `options` asks for; print and write the table; 1 if a check failed."""
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    records: list[Record] = []
    # The drains first (every repetition), then W3 (every repetition), so that
    # W3's "W2b best" is the configuration the table reports as best.
    for run in range(options.repeat):
        log(f"run {run + 1}/{options.repeat}, N = {options.n:,}: W1, W1b, W2, W4, W7")
        options.run = run
        record = Record()
        for side in rotated(drain_sides(options), run):
            side(options, record)
        if "w7" in options.workloads:
            run_venturi_dedup(options, record)
        # W6 and W8 are slow to set up and measure growth, not a rate: once per invocation.
        if run == 0 and "w6" in options.workloads:
            run_venturi_backlog(options, record)
        if run == 0 and "w8" in options.workloads:
            run_venturi_memory(options, record)
        records.append(record)
    if "w2c" in options.workloads:
        venturi_cell, pgq_cell = w2c_cells(options, records)
        for run, record in enumerate(records):
            log(f"run {run + 1}/{options.repeat}: W2c, {options.w2c_n:,} jobs")
            options.run = run
            sides = [lambda o, r: run_venturi_w2c(o, r, venturi_cell)]
            if "pgqueuer" in options.peers:
                sides.append(lambda o, r: run_pgq_w2c(o, r, pgq_cell))
            for side in rotated(sides, run):
                side(options, record)
    if "w3" in options.workloads:
        for run, record in enumerate(records):
            log(f"run {run + 1}/{options.repeat}: W3")
            options.run = run
            for side in rotated(wake_sides(options, records), run):
                side(options, record)
    table, failures = build_table(options, records)
    if options.peers:
        comparison, peer_failures = compare.build(options, records)
        table = comparison + "\n" + table
        failures += peer_failures
    elapsed = time.monotonic() - started
    footer = f"\nTotal time {elapsed:.0f} s. " + (
        "All checks passed."
        if not failures
        else "FAILED CHECKS:\n" + "\n".join(f"- {failure}" for failure in failures)
    )
    print(table + footer)
    output = options.output
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(table + footer + "\n")
    draw_chart(options, records, table.splitlines()[0].removeprefix("### "))
    raw = [dataclasses.asdict(record) for record in records]
    output.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    return 1 if failures else 0
