"""W4, the physical limit: a hand-written psycopg 3 queue, no library.

Schema, enqueue and the two workers exactly as WORKLOAD.md section W4 defines
them. The worker is a process of its own (`python -m benchmarks.limit worker
--mode claim1|batch100 --dsn ...`), with one connection, prepared statements
on, waiting on `LISTEN peerbench` (1 s timeout) when the queue is empty. It
appends to the same sink as the venturi handler.
"""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks import sink

CHANNEL = "peerbench"

SCHEMA = """
CREATE TABLE peerbench_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload int NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX peerbench_jobs_queued ON peerbench_jobs (id) WHERE status = 'queued';
"""

ENQUEUE_ONE = (
    "WITH j AS (INSERT INTO peerbench_jobs (payload) VALUES (%s) RETURNING id) "
    "SELECT pg_notify('peerbench', '') FROM j"
)
ENQUEUE_BULK = "INSERT INTO peerbench_jobs (payload) SELECT unnest(%s::int[])"
BULK_NOTIFY = "SELECT pg_notify('peerbench', '')"

CLAIM1 = """
UPDATE peerbench_jobs SET status = 'running', started_at = now()
WHERE id = (SELECT id FROM peerbench_jobs WHERE status = 'queued'
            ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
RETURNING id, payload
"""
DONE1 = "UPDATE peerbench_jobs SET status = 'done', finished_at = now() WHERE id = %s"

CLAIM100 = """
UPDATE peerbench_jobs SET status = 'running', started_at = now()
WHERE id IN (SELECT id FROM peerbench_jobs WHERE status = 'queued'
             ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 100)
RETURNING id, payload
"""
DONE_MANY = "UPDATE peerbench_jobs SET status = 'done', finished_at = now() WHERE id = ANY(%s)"

UNFINISHED = "SELECT count(*) FROM peerbench_jobs WHERE status IN ('queued', 'running')"


def install(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)


def enqueue_single(dsn: str, n: int, start: int = 0) -> float:
    """W1: n autocommit INSERT+NOTIFY statements; return the elapsed seconds."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        began = time.perf_counter()
        for i in range(start, start + n):
            conn.execute(ENQUEUE_ONE, (i,))
        return time.perf_counter() - began


def enqueue_bulk(dsn: str, n: int) -> float:
    """W1b: one INSERT ... SELECT unnest() of n rows (one transaction)."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        began = time.perf_counter()
        conn.execute(ENQUEUE_BULK, (list(range(n)),))
        elapsed = time.perf_counter() - began
        conn.execute(BULK_NOTIFY)
        return elapsed


def enqueuer(dsn: str) -> tuple[psycopg.Connection[Any], Callable[[int], None]]:
    """A connected single-job enqueue (W3's producer)."""
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    return conn, lambda i: conn.execute(ENQUEUE_ONE, (i,)) and None


def work(dsn: str, mode: str) -> None:
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    conn = psycopg.connect(dsn, prepare_threshold=0)
    conn.execute(f"LISTEN {CHANNEL}")
    conn.commit()
    claim = CLAIM1 if mode == "claim1" else CLAIM100
    while not stopping:
        rows = conn.execute(claim).fetchall()
        if not rows:
            conn.commit()
            for _ in conn.notifies(timeout=1.0, stop_after=1):
                pass
            continue
        if mode == "claim1":
            (job_id, payload) = rows[0]
            sink.handle(payload)
            conn.execute(DONE1, (job_id,))
        else:
            for _job_id, payload in rows:
                sink.handle(payload)
            conn.execute(DONE_MANY, ([job_id for job_id, _ in rows],))
        conn.commit()
    conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("--mode", choices=["claim1", "batch100"], required=True)
    worker.add_argument("--dsn", required=True)
    args = parser.parse_args(argv)
    work(args.dsn, args.mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
