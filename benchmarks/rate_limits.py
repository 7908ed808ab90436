"""Rate limits across workers: exact, and how close to the ideal time?

    python benchmarks/rate_limits.py                 # 5 rounds (~3 min)
    python benchmarks/rate_limits.py --rounds 1 --jobs 200

Each round starts `--workers` (8) `venturi_worker --concurrency 8` processes in a fresh
database, lets them go idle, then enqueues `--jobs` (1,000) `bench.rated` jobs in one
transaction: a kind limited to 50 starts a second (`venturi.RateLimit(50,
per=timedelta(seconds=1))`) whose handler writes its start to the sink. The limit
allows no more than 50 starts in any second, so the ideal is 50 starting at once, then
50 more each second: jobs / 50 - 1 seconds from the first start to the last.
It prints the median over the rounds of that span against the ideal, the time from the
enqueue to the first start, and the most starts within any one second (max over the
rounds; the limit is 50). Targets: never over 50, and within 10 % of the ideal span.
The tests check the limit with real workers (tests/test_rate_limits.py); how near the
ideal it comes is measured here, not asserted there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.flow_control import admin_dsn, env, fresh_database  # noqa: E402
from benchmarks.idle_fleet import enqueue_in_child, fleet_arguments, idle_fleet  # noqa: E402
from benchmarks.sink import SinkReader  # noqa: E402

DBNAME = "venturi_bench_rate_limits"
RATED_PER_SECOND = 50
"""bench.rated's limit (benchmarks/bench_project/benchapp/tasks.py reads it here)."""


def enqueue(jobs: int) -> None:
    """Run in a child process with Django set up: enqueue the jobs in one transaction and
    print the wall-clock time the enqueue began."""
    import django

    django.setup()
    import django_venturi as venturi
    from benchmarks.bench_project.benchapp import tasks

    batch = [tasks.RatedJob(i=i) for i in range(jobs)]  # type: ignore[attr-defined]
    began = time.time()
    venturi.enqueue_many(batch)
    print(began)


def most_within_a_second(starts: list[float]) -> int:
    """The most of `starts` (sorted) within any window of one second."""
    most, first = 0, 0
    for last, start in enumerate(starts):
        while start - starts[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def run(options: argparse.Namespace) -> dict[str, float]:
    fresh_database(DBNAME)
    with tempfile.TemporaryDirectory() as tmp:
        sink = SinkReader(str(Path(tmp) / "sink"))
        fleet_env = env(Path(sink.path), rated=True, dbname=DBNAME)
        with idle_fleet(options.workers, options.concurrency, fleet_env, DBNAME):
            enqueued = enqueue_in_child(
                Path(__file__), [str(options.jobs)], env(rated=True, dbname=DBNAME)
            )
            deadline = time.monotonic() + 600
            while sink.poll() < options.jobs:
                if time.monotonic() > deadline:
                    raise RuntimeError("the jobs did not start")
                time.sleep(0.02)
    starts = sorted(min(sink.times[i]) for i in range(options.jobs))
    span = starts[-1] - starts[0]
    return {
        "span": span,
        "vs_ideal": span / ideal_span(options.jobs),
        "first_start_ms": 1000 * (starts[0] - enqueued),
        "most_in_a_second": most_within_a_second(starts),
    }


def ideal_span(jobs: int) -> float:
    return jobs / RATED_PER_SECOND - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    fleet_arguments(parser)
    options = parser.parse_args()
    results: list[dict[str, float]] = []
    try:
        for round_number in range(options.rounds):
            result = run(options)
            results.append(result)
            shown = ", ".join(f"{name} {value:,.3f}" for name, value in result.items())
            print(f"round {round_number + 1}: {shown}", file=sys.stderr)
    finally:
        with psycopg.connect(admin_dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DBNAME}" WITH (FORCE)')
    span = statistics.median(result["span"] for result in results)
    first = statistics.median(result["first_start_ms"] for result in results)
    most = max(result["most_in_a_second"] for result in results)
    ideal = ideal_span(options.jobs)
    print(
        f"| {options.jobs:,} jobs at {RATED_PER_SECOND} a second, {options.workers} workers "
        f"x {options.concurrency} (median of {options.rounds}) | first to last start "
        f"| vs ideal ({ideal:.0f} s) | enqueue to first start | most starts in a second |"
    )
    print("|---|---:|---:|---:|---:|")
    print(
        f"| bench.rated | {span:.2f} s | {span / ideal:.3f} | {first:.0f} ms "
        f"| {most} (limit {RATED_PER_SECOND}) |"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "enqueue":
        enqueue(int(sys.argv[2]))
    else:
        main()
