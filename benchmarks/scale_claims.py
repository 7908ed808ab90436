"""W9 claims of `scale.py`: claim statements per enqueue with 1 and 8 idle workers.

In each phase's database a statement trigger (`CLAIM_COUNTER_SQL`) counts the claim
statements, and those that took a job, in two sequences. `count_claims` starts the
workers, has them handle a probe job, then reads the counters over an idle window
and over an equal window in which a producer enqueues on an absolute schedule
(`paced_windows`); the claims that took a job must equal the enqueues.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import Any

import psycopg

from benchmarks.harness import (
    VENTURI_UNFINISHED,
    child_env,
    dsn,
    log,
    spawned,
    venturi_workers,
)
from benchmarks.scale_common import (
    DRAIN_CELL,
    ClaimCount,
    Reading,
    Results,
    ScaleOptions,
    execute,
    produce,
    scale_database,
    wait_until,
)
from benchmarks.sink import SinkReader

CLAIM_WORKERS = (1, 8)
PROBE_I = 90_000_000
PRODUCER_MARGIN = 4.0
"""Seconds from spawning the paced producer to the idle window's start: its set-up."""

# Counts every claim statement: an AFTER ... FOR EACH STATEMENT trigger fires once per
# UPDATE statement, even one that updates no row (an empty claim), and
# current_query() is the text the client sent. Only the claim is an UPDATE of the job
# table that says both `SET state = 'running'` and `FOR UPDATE SKIP LOCKED` (the
# lease rescuer locks with `FOR NO KEY UPDATE OF job SKIP LOCKED`). Sequences, not a
# table, keep count: nextval() writes no row and is seen at once, outside transactions.
# The second counts the claims that took at least one job (the transition table holds
# the rows the statement updated): with one job per enqueue, 200 ms apart, it must
# equal the number of enqueues, which validates the count.
CLAIM_COUNTER_SQL = """
CREATE SEQUENCE venturi_scale_claims;
CREATE SEQUENCE venturi_scale_claims_taking;
CREATE FUNCTION venturi_scale_count_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_query() LIKE '%SET state = ''running''%'
       AND current_query() LIKE '%FOR UPDATE SKIP LOCKED%' THEN
        PERFORM nextval('venturi_scale_claims');
        IF EXISTS (SELECT 1 FROM claimed) THEN
            PERFORM nextval('venturi_scale_claims_taking');
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER venturi_scale_count_claim AFTER UPDATE ON django_venturi_job
    REFERENCING NEW TABLE AS claimed
    FOR EACH STATEMENT EXECUTE FUNCTION venturi_scale_count_claim();
"""
CLAIMS_READ = """
SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM venturi_scale_claims),
       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM venturi_scale_claims_taking),
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
"""


def run_claims(options: ScaleOptions, results: Results) -> None:
    """Claim statements per enqueue: idle window, then an equal window of paced enqueues."""
    for workers in CLAIM_WORKERS:
        with scale_database(options, f"claims_{workers}") as dbname:
            execute(options, dbname, CLAIM_COUNTER_SQL)
            results.claims[workers] = count_claims(options, dbname, workers)
        log(f"  claims, {workers} idle worker(s): {describe_claims(results.claims[workers])}")


def count_claims(options: ScaleOptions, dbname: str, workers: int) -> ClaimCount:
    """Start the workers, handle a probe, wait; then window A-B idle, B-C paced enqueues."""
    sink_path = options.artifact(f"claims_{workers}.sink")
    sink_path.unlink(missing_ok=True)
    reader = SinkReader(str(sink_path))
    env = child_env(options, dbname, sink_path)
    cell = dataclasses.replace(DRAIN_CELL, processes=workers)
    problems: list[str] = []
    with (
        psycopg.connect(dsn(options, dbname), autocommit=True) as conn,
        spawned(venturi_workers(cell), env, options.artifact(f"claims_{workers}")) as procs,
    ):
        produce(options, dbname, "one", "--i", str(PROBE_I))
        if not wait_until(lambda: reader.poll() >= 1, 30.0, procs):
            problems.append("the probe job was not handled within 30 s")
        time.sleep(options.wake_settle)
        readings, producer_problems = paced_windows(options, conn, env)
        problems += producer_problems
        handled = reader.poll() - 1
        exits = [p.returncode for p in procs if p.poll() is not None]
        if exits:
            problems.append(f"worker exited early (codes {exits})")
        (unfinished,) = conn.execute(VENTURI_UNFINISHED).fetchone()
    idle, busy = readings[1] - readings[0], readings[2] - readings[1]
    if handled != options.claim_jobs:
        problems.append(f"{handled}/{options.claim_jobs} paced jobs handled within the window")
    if reader.duplicates():
        problems.append(f"{len(reader.duplicates())} i handled twice")
    if unfinished:
        problems.append(f"{unfinished} jobs unfinished")
    if busy.taking != options.claim_jobs:
        problems.append(
            f"count not validated: {busy.taking} claims took a job, expected one per enqueue "
            f"({options.claim_jobs}); does the trigger's match still fit the claim's SQL?"
        )
    return ClaimCount(workers, options.claim_jobs, idle, busy, problems)


def paced_windows(
    options: ScaleOptions, conn: psycopg.Connection[Any], env: dict[str, str]
) -> tuple[list[Reading], list[str]]:
    """Readings at A, B = A + window, C = B + window; the producer enqueues from B on.

    The producer is spawned PRODUCER_MARGIN seconds before A, so its start-up (Django
    set-up, connecting) falls in neither window.
    """
    window = options.claim_window
    start = time.time() + PRODUCER_MARGIN + window
    argv = [sys.executable, "-m", "benchmarks.scale", "produce", "paced"]
    argv += ["--n", str(options.claim_jobs), "--interval", str(options.claim_interval)]
    argv += ["--start", repr(start)]
    readings: list[Reading] = []
    problems: list[str] = []
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as producer:
        for at in (start - window, start, start + window):
            time.sleep(max(0.0, at - time.time()))
            conn.execute("SELECT pg_stat_clear_snapshot()")
            readings.append(Reading(*conn.execute(CLAIMS_READ).fetchone()))
        out, _ = producer.communicate(timeout=60)
    if producer.returncode != 0:
        problems.append(f"paced producer failed ({producer.returncode})")
    elif (late := json.loads(out)["ready"] - (start - window)) > 0:
        problems.append(f"producer set up {late:.2f} s into the idle window")
    return readings, problems


def describe_claims(result: ClaimCount) -> str:
    problems = "; ".join(result.problems)
    return (
        f"{result.per_enqueue:.2f} claims per enqueue ({result.busy.claims} with "
        f"{result.jobs} enqueues, {result.busy.taking} of them took a job; "
        f"{result.idle.claims} idle), "
        f"{result.commits_per_enqueue:.1f} transactions per enqueue"
    ) + (f" [{problems}]" if problems else "")
