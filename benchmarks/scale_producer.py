"""The producer side of `scale.py`: `python -m benchmarks.scale produce MODE ...`.

Run as a subprocess with Django set up, it prints one JSON object: `bulk` (one
`enqueue_many` in one transaction), `one` (a single probe job), `paced` (jobs on an
absolute schedule, each its own transaction) and `alone` (the handlers called in a
loop with no queue, W5's ceiling).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.config import SETTINGS

TASKS = {"sink": "bench.sink", "orm": "bench.orm", "rich": "bench.rich"}


# ---------------------------------------------------------------- the producer side


def producer_main(argv: list[str]) -> int:
    """`python -m benchmarks.scale produce MODE ...`: Django set up, prints one JSON object."""
    parser = argparse.ArgumentParser(prog="benchmarks.scale produce")
    parser.add_argument("mode", choices=["bulk", "one", "paced", "alone"])
    parser.add_argument("--task", choices=sorted(TASKS), default="sink")
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--i", type=int, default=0)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--start", type=float, default=0.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    import django
    from django.db import connection

    django.setup()
    connection.ensure_connection()
    if args.mode == "bulk":
        result = produce_bulk(args.task, args.n)
    elif args.mode == "alone":
        result = run_alone(args.task, args.n)
    elif args.mode == "one":
        make_job("sink")(args.i).enqueue()
        result = {"n": 1}
    else:
        result = produce_paced(args.n, args.interval, args.start)
    json.dump(result, sys.stdout)
    return 0


def make_job(task: str) -> Callable[[int], Any]:
    from benchmarks.bench_project.benchapp import tasks

    factories: dict[str, Callable[[int], Any]] = {
        "sink": lambda i: tasks.SinkJob(i=i),
        "orm": lambda i: tasks.OrmJob(i=i),
        "rich": tasks.RichJob.example,
    }
    return factories[task]


def produce_bulk(task: str, n: int) -> dict[str, Any]:
    """One `enqueue_many` inside `transaction.atomic()`, building the list included."""
    from django.db import transaction

    import django_venturi as venturi

    factory = make_job(task)
    start = time.perf_counter()
    with transaction.atomic():
        jobs = venturi.enqueue_many([factory(i) for i in range(n)])
    committed = time.time()
    elapsed = time.perf_counter() - start
    assert len(jobs) == n
    return {"n": n, "elapsed": elapsed, "committed": committed}


def run_alone(task: str, n: int) -> dict[str, Any]:
    """The handlers of n jobs of `task` called in a loop, one thread, no queue at all:
    what one interpreter does with that handler alone (W5's ceiling)."""
    import tempfile

    factory = make_job(task)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["VENTURI_BENCH_SINK"] = os.path.join(scratch, "sink")
        jobs = [factory(i) for i in range(n)]
        start = time.perf_counter()
        for job in jobs:
            job.handle(None)
        elapsed = time.perf_counter() - start
    return {"n": n, "elapsed": elapsed}


def produce_paced(n: int, interval: float, start: float) -> dict[str, Any]:
    """Job i enqueued at start + i x interval (absolute schedule), each its own transaction."""
    from django.db import connection

    assert connection.get_autocommit()
    factory = make_job("sink")
    ready = time.time()
    for i in range(n):
        time.sleep(max(0.0, start + i * interval - time.time()))
        factory(i).enqueue()
    return {"n": n, "ready": ready}
