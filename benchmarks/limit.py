"""W4, the physical limit: a hand-written psycopg 3 queue, no library.

Schema, enqueue and the two workers exactly as WORKLOAD.md section W4 defines
them. The worker is a process of its own (`python -m benchmarks.limit worker
--mode claim1|batch100 --dsn ...`), with one connection, prepared statements
on, waiting on `LISTEN peerbench` (1 s timeout) when the queue is empty. It
appends to the same sink as the venturi handler.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import psycopg

from benchmarks import sink
from benchmarks.wake import wake_schedule

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
        return time.perf_counter() - began


def wake(dsn: str, *, count: int, interval: float, sink_path: str, settle: float, wait: float):
    """W3's producer: connected before the loop, one autocommit INSERT+NOTIFY per job."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:

        def enqueue(i: int) -> None:
            conn.execute(ENQUEUE_ONE, (i,))

        return wake_schedule(
            enqueue, count=count, interval=interval, sink_path=sink_path, settle=settle, wait=wait
        )


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
    waker = sub.add_parser("wake", help="W3's producer")
    waker.add_argument("--dsn", required=True)
    waker.add_argument("--n", type=int, default=200)
    waker.add_argument("--interval", type=float, default=0.020)
    waker.add_argument("--settle", type=float, default=1.0)
    waker.add_argument("--wait", type=float, default=15.0)
    args = parser.parse_args(argv)
    if args.command == "worker":
        work(args.dsn, args.mode)
    else:
        result = wake(
            args.dsn,
            count=args.n,
            interval=args.interval,
            sink_path=os.environ[sink.SINK_ENV],
            settle=args.settle,
            wait=args.wait,
        )
        json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
