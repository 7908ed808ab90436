"""The Django side of the harness: enqueue jobs through django-venturi's public API.

Run by `run.py` as a subprocess (`python -m benchmarks.producer MODE ...`) with
VENTURI_BENCH_DB naming the database; prints one JSON object on stdout.
Timing starts after Django is set up and the first connection is made.

  single  N `SinkJob(i=i).enqueue()` calls in autocommit (W1)
  bulk    one `venturi.enqueue_many([...])` call inside `transaction.atomic()` (W1b;
          W6 and W8 too, with --first for the first i)
  wake    the W3 probe, then 200 jobs on an absolute 20 ms schedule, one transaction each
  dedup   one of W7's concurrent producers: sleep until --start (a time.time() value),
          then N `CountJob(key=i % KEYS).enqueue()` calls in autocommit
  steps   N `StepJob`s, one `venturi.enqueue_many` (the plain drain of benchmarks/workflows.py)
  chain   `venturi.chain()` of N `StepJob`s
  group   `venturi.group()` of N `StepJob`s with a `StepJob` callback
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.bench_project.settings")


def _setup() -> None:
    import django
    from django.db import connection

    django.setup()
    connection.ensure_connection()


def single(n: int) -> dict[str, float | int]:
    from django.db import connection

    from benchmarks.bench_project.benchapp.tasks import SinkJob

    assert connection.get_autocommit()
    start = time.perf_counter()
    for i in range(n):
        SinkJob(i=i).enqueue()
    elapsed = time.perf_counter() - start
    return {"n": n, "elapsed": elapsed, "statements": n, "transactions": n}


def bulk(n: int, first: int = 0) -> dict[str, float | int]:
    from django.db import transaction

    import django_venturi as venturi
    from benchmarks.bench_project.benchapp.tasks import SinkJob
    from django_venturi.enqueue import INSERT_BATCH_SIZE

    start = time.perf_counter()
    with transaction.atomic():
        jobs = venturi.enqueue_many([SinkJob(i=i) for i in range(first, first + n)])
    elapsed = time.perf_counter() - start
    assert len(jobs) == n
    return {
        "n": n,
        "elapsed": elapsed,
        "statements": -(-n // INSERT_BATCH_SIZE),
        "rows_per_statement": INSERT_BATCH_SIZE,
        "transactions": 1,
    }


def wake(count: int, interval: float, sink_path: str, settle: float, wait: float) -> dict:
    from benchmarks.bench_project.benchapp.tasks import SinkJob
    from benchmarks.wake import wake_schedule

    return wake_schedule(
        lambda i: SinkJob(i=i).enqueue(),
        count=count,
        interval=interval,
        sink_path=sink_path,
        settle=settle,
        wait=wait,
    )


def dedup(n: int, keys: int, start: float) -> dict[str, float | int]:
    from django.db import connection

    from benchmarks.bench_project.benchapp.tasks import CountJob

    assert connection.get_autocommit()
    ready = time.time()  # set up and connected: the barrier is only fair if this is before start
    time.sleep(max(0.0, start - time.time()))
    t_begin = time.time()
    for i in range(n):
        CountJob(key=i % keys).enqueue()
    t_end = time.time()
    return {"n": n, "ready": ready, "t_begin": t_begin, "t_end": t_end}


def workflow(mode: str, n: int) -> dict[str, float | int | list[int]]:
    """Enqueue N steps as plain jobs, a chain, or a group with a callback (its last id)."""
    import django_venturi as venturi
    from benchmarks.bench_project.benchapp.tasks import StepJob

    steps = [StepJob(i=i) for i in range(n)]
    start = time.perf_counter()
    if mode == "steps":
        jobs = venturi.enqueue_many(steps)
    elif mode == "chain":
        jobs = venturi.chain(*steps).enqueue()
    else:
        members, callback = venturi.group(steps, then=StepJob(i=n)).enqueue()
        jobs = [*members, callback]
    elapsed = time.perf_counter() - start
    return {"n": n, "elapsed": elapsed, "first": jobs[0].pk, "last": jobs[-1].pk}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "mode", choices=["single", "bulk", "wake", "dedup", "steps", "chain", "group"]
    )
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=0.020)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--wait", type=float, default=15.0)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--start", type=float, default=0.0)
    parser.add_argument("--first", type=int, default=0, help="bulk: the first i")
    args = parser.parse_args(argv)
    _setup()
    if args.mode == "single":
        result = single(args.n)
    elif args.mode == "bulk":
        result = bulk(args.n, args.first)
    elif args.mode == "dedup":
        result = dedup(args.n, args.keys, args.start)
    elif args.mode in ("steps", "chain", "group"):
        result = workflow(args.mode, args.n)
    else:
        result = wake(
            args.n, args.interval, os.environ["VENTURI_BENCH_SINK"], args.settle, args.wait
        )
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
