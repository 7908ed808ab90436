"""W7, dedup under contention (this suite's own workload).

`run_venturi_dedup` releases DEDUP_PRODUCERS producer processes (`producer.py dedup`)
at one start time, each enqueueing keyed `CountJob`s over DEDUP_KEYS keys; the
database must then hold one live job per key, whose `count`s add up to the enqueues.
`describe_dedup` is its line in the progress log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import psycopg

from benchmarks.config import DEDUP_KEYS, DEDUP_PRODUCERS, DEDUP_TIMEOUT, Options, dedup_margin
from benchmarks.harness import child_env, dsn, fresh_database, log, migrate
from benchmarks.results import MISSING, Dedup, Record, fmt

DEDUP_LIVE = """
SELECT count(*) FILTER (WHERE state IN ('ready', 'running')),
       coalesce(sum((payload->>'count')::bigint) FILTER (WHERE state IN ('ready', 'running')), 0),
       coalesce(sum(merged_count) FILTER (WHERE state IN ('ready', 'running')), 0),
       count(*)
FROM django_venturi_job WHERE kind = 'bench.count'
"""


def run_venturi_dedup(options: Options, record: Record) -> None:
    """W7: 8 producers released at one start time, each N keyed enqueues over 10 keys."""
    producers, per_producer = DEDUP_PRODUCERS, options.dedup_per_producer
    with fresh_database(options, "w7") as dbname:
        migrate(options, dbname)
        env = child_env(options, dbname)
        start = time.time() + dedup_margin(producers)
        argv = [sys.executable, "-m", "benchmarks.producer", "dedup", "--n", str(per_producer)]
        argv += ["--keys", str(DEDUP_KEYS), "--start", repr(start)]
        processes = [
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(producers)
        ]
        results: list[dict[str, Any]] = []
        errors: list[str] = []
        deadline = time.monotonic() + dedup_margin(producers) + DEDUP_TIMEOUT
        for k, process in enumerate(processes):
            try:
                out, err = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
                errors.append(f"producer {k} timed out")
                continue
            if process.returncode != 0:
                last = (err.strip().splitlines() or ["?"])[-1]
                errors.append(f"producer {k} failed ({process.returncode}): {last[:200]}")
                log(err[-4000:])
                continue
            results.append(json.loads(out))
        with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
            live, count_sum, merged, rows = conn.execute(DEDUP_LIVE).fetchone()
    elapsed = rate = None
    if results and not errors:
        elapsed = max(r["t_end"] for r in results) - start
        rate = producers * per_producer / elapsed
    record.dedup = Dedup(
        producers=producers,
        per_producer=per_producer,
        keys=DEDUP_KEYS,
        elapsed=elapsed,
        rate=rate,
        live=live,
        count_sum=count_sum,
        merged=merged,
        rows=rows,
        late=sorted(r["ready"] - start for r in results if r["ready"] > start),
        slack=min((start - r["ready"] for r in results), default=None),
        errors=errors,
    )
    if rate is not None:
        record.enqueue["dedup"] = rate
    log(f"  W7 dedup under contention: {describe_dedup(record.dedup)}")


def describe_dedup(result: Dedup) -> str:
    problems = "; ".join(result.problems())
    seconds = MISSING if result.elapsed is None else f"{result.elapsed:.2f} s"
    return (
        f"{fmt(result.rate)} enqueues/s ({result.total:,} in {seconds}), "
        f"{result.live} live jobs, sum of count {result.count_sum:,}, "
        f"{result.merged:,} merges; shortest wait at the barrier {fmt(result.slack, 2)} s"
    ) + (f" [{problems}]" if problems else "")
