"""W5 of `scale.py`, a realistic handler: the ORM drain beside the no-op drain.

`run_w5` times the ORM handler alone (its body in a loop, one thread, no queue),
then per cell drains N no-op (`bench.sink`) and N ORM jobs (`bench.orm`: read one
`Counter` row, update one), each in its own database, with the sessions each drain
opened; `counter_problems` checks that the counters add up.
"""

from __future__ import annotations

import psycopg

from benchmarks.harness import dsn, log
from benchmarks.results import describe
from benchmarks.scale_common import (
    Measured,
    Results,
    ScaleOptions,
    bulk,
    execute,
    measured_drain,
    produce,
    scale_database,
)

W5_DRAIN_TIMEOUT = 300.0
"""W5's drains may take longer than WORKLOAD.md's 45 s: a handler that opens a new
database connection per job runs at a few hundred jobs/s here."""
COUNTER_SEED = (
    "INSERT INTO benchapp_counter (id, value, touched_at) "
    "SELECT g, 0, NULL FROM generate_series(1, %s) AS g"
)
COUNTER_CHECK = "SELECT coalesce(sum(value), 0), count(touched_at) FROM benchapp_counter"


# ---------------------------------------------------------------- W5: a realistic handler


def run_w5(options: ScaleOptions, results: Results) -> None:
    with scale_database(options, "w5_alone") as dbname:
        execute(options, dbname, COUNTER_SEED, [options.counter_rows])
        alone = produce(options, dbname, "alone", "--task", "orm", "--n", str(options.n))
        results.w5_alone = alone["n"] / alone["elapsed"]
        log(f"  W5 ORM handler alone: {results.w5_alone:,.0f} jobs/s")
    for cell in options.w5_cells:
        tag = f"{cell.processes}x{cell.concurrency or 'default'}"
        for task in ("sink", "orm"):
            with scale_database(options, f"w5_{tag}_{task}") as dbname:
                if task == "orm":
                    execute(options, dbname, COUNTER_SEED, [options.counter_rows])
                bulk(options, dbname, task, options.n)
                drained, sessions = measured_drain(
                    options, dbname, cell, f"w5_{tag}_{task}", options.n, W5_DRAIN_TIMEOUT
                )
                result = Measured(drained, sessions=sessions)
                if task == "orm":
                    result.problems += counter_problems(options, dbname, options.n)
            results.w5[(cell.label(), task)] = result
            log(f"  W5 {task} {cell.label()}: {describe(drained)}, {sessions} sessions")


def counter_problems(options: ScaleOptions, dbname: str, n: int) -> list[str]:
    """Every ORM job's update landed once: the counters add up to n."""
    with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
        total, touched = conn.execute(COUNTER_CHECK).fetchone()
    expected_touched = min(n, options.counter_rows)
    found = []
    if total != n:
        found.append(f"counters add up to {total:,}, expected {n:,}")
    if touched != expected_touched:
        found.append(f"{touched:,} counters touched, expected {expected_touched:,}")
    return found
