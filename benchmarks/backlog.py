"""W6, claim cost against the size of the table (this suite's own workload).

`run_venturi_backlog` has one worker (`W6_CELL`) claim and complete W6_TARGET jobs
beside many rows it must not take (`W6_CASES`): ready jobs due tomorrow, in the very
range of the claim index the claim walks, or finished ones, outside the partial
index. `build_w6_table` adds those rows in one INSERT ... SELECT; the drain is W2's.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import psycopg

from benchmarks.config import W6_CELL, Options
from benchmarks.harness import (
    VENTURI_DONE_ONCE,
    VENTURI_UNFINISHED,
    drain,
    dsn,
    fresh_database,
    log,
    migrate,
    produce,
    venturi_workers,
)
from benchmarks.results import Record, describe

W6_BUILD = """
INSERT INTO django_venturi_job
    (kind, queue, priority, rank, state, payload, attempt, failures, run_at, enqueued_at,
     started_at, finished_at, claimed_by, last_error)
SELECT template.kind, template.queue, template.priority, template.rank, %(state)s,
       jsonb_set(template.payload, '{i}', to_jsonb(%(base)s + g)), %(attempt)s, 0,
       now() + %(run_in)s::interval, now(), %(finished_at)s, %(finished_at)s, '', ''
FROM (SELECT * FROM django_venturi_job ORDER BY id LIMIT 1) AS template,
     generate_series(1, %(count)s) AS g
"""
W6_OTHERS_BASE = 50_000_000
"""The `i` of the jobs the W6 worker must not take (never written to the sink)."""


def build_w6_table(options: Options, dbname: str, state: str, count: int) -> float:
    """Add `count` rows the worker will not take, in one INSERT ... SELECT; return seconds."""
    ready = state == "ready"
    params = {
        "state": "ready" if ready else "completed",
        "base": W6_OTHERS_BASE,
        "attempt": 0 if ready else 1,
        "run_in": "1 day" if ready else "-1 hour",
        "finished_at": None if ready else dt_now(),
        "count": count,
    }
    started = time.monotonic()
    with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
        conn.execute(W6_BUILD, params)
    return time.monotonic() - started


def dt_now() -> Any:
    import datetime

    return datetime.datetime.now(datetime.UTC)


def run_venturi_backlog(options: Options, record: Record) -> None:
    """W6: claim-and-complete TARGET jobs beside 10k / 1M other rows, one database each."""
    target = options.w6_target
    for key, state, count in options.w6_cases:
        with fresh_database(options, f"w6_{key}") as dbname:
            migrate(options, dbname)
            produce(options, dbname, "bulk", "--n", str(target))
            with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
                (last_target,) = conn.execute("SELECT max(id) FROM django_venturi_job").fetchone()
            built = build_w6_table(options, dbname, state, count)
            bound = f" AND id <= {int(last_target)}"
            drained = drain(
                dataclasses.replace(options, n=target),
                dbname,
                venturi_workers(W6_CELL),
                name=f"w6_{key}",
                unfinished_sql=VENTURI_UNFINISHED + bound,
                done_once_sql=VENTURI_DONE_ONCE + bound,
            )
            record.drains[f"w6:{key}"] = drained
            record.notes[f"w6:{key}"] = f"{count:,} {state} rows built in {built:.1f} s"
            log(f"  W6 {target:,} jobs beside {count:,} {state}: {describe(drained)}")
