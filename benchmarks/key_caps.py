"""Concurrency caps per key (issue 34): exact across workers, and how close to ideal?

    python benchmarks/key_caps.py                  # 5 rounds (~3 min)
    python benchmarks/key_caps.py --rounds 1 --seconds 0.2

Each round runs two variants, in alternating order, each in a fresh database:
  capped     `--workers` (8) `venturi_worker --concurrency 8` processes run `--jobs`
             (1,000) `bench.key_capped` jobs spread over `--keys` (20) keys, at most 2
             running per key (`venturi.Concurrency(2, key="key")`);
  reference  the same jobs, uncapped (`bench.sleep`), on as many handler slots as the
             caps leave (keys x 2 = 40: 5 workers of 8), to show what the runtime itself
             costs at that parallelism.
Every handler sleeps `--seconds` (0.5) and writes its own start and end to the sink.
The workers start first and go idle; then one transaction enqueues every job. Ideal
time: each key's jobs, 2 at a time, back to back: jobs / keys / 2 x seconds.
It prints, per variant, the median over the rounds of the time from the enqueue to
the last handler's end, against the ideal; the most jobs of one key that ever
ran at once (from the handlers' timestamps; the cap is 2); and the hand-off: how
long after a place of its key freed each later job started.
Targets: never more than 2 per key, and within 10 % of the ideal time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.flow_control import admin_dsn, env, fresh_database  # noqa: E402
from benchmarks.idle_fleet import enqueue_in_child, fleet_arguments, idle_fleet  # noqa: E402
from benchmarks.sink import SinkReader  # noqa: E402

DBNAME = "venturi_bench_key_caps"
VARIANTS = ("capped", "reference")
CAP = 2
ENDED = 50_000_000  # benchapp.tasks.ENDED: an end is written at the job's index plus this


def enqueue(variant: str, jobs: int, keys: int, seconds: float) -> None:
    """Run in a child process with Django set up: enqueue the variant's jobs in one
    transaction and print the wall-clock time the enqueue began."""
    import django

    django.setup()
    import django_venturi as venturi
    from benchmarks.bench_project.benchapp import tasks

    task = tasks.KeyCappedJob if variant == "capped" else tasks.SleepJob  # type: ignore[attr-defined]
    batch = [task(i=i, key=i % keys, seconds=seconds) for i in range(jobs)]
    began = time.time()
    venturi.enqueue_many(batch)
    print(began)


def peak(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at the same time)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = most = 0
    for _, change in events:
        open_now += change
        most = max(most, open_now)
    return most


def run(variant: str, options: argparse.Namespace) -> dict[str, float]:
    fresh_database(DBNAME)
    keyed = variant == "capped"
    processes = options.workers if keyed else options.keys * CAP // options.concurrency
    with tempfile.TemporaryDirectory() as tmp:
        sink = SinkReader(str(Path(tmp) / "sink"))
        fleet_env = env(Path(sink.path), keyed=keyed, dbname=DBNAME)
        with idle_fleet(processes, options.concurrency, fleet_env, DBNAME):
            enqueued = enqueue_in_child(
                Path(__file__),
                [variant, str(options.jobs), str(options.keys), str(options.seconds)],
                env(keyed=keyed, dbname=DBNAME),
            )
            deadline = time.monotonic() + 600
            while sum(1 for i in sink.times if i >= ENDED) < options.jobs:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{variant}: the jobs did not finish")
                sink.poll()
                time.sleep(0.02)
    by_key: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for i in range(options.jobs):
        by_key[i % options.keys].append((min(sink.times[i]), min(sink.times[i + ENDED])))
    last_end = max(end for runs in by_key.values() for _, end in runs)
    gaps = sorted(gap for runs in by_key.values() for gap in handoffs(runs))
    ideal = options.jobs / options.keys / CAP * options.seconds
    return {
        "elapsed": last_end - enqueued,
        "vs_ideal": (last_end - enqueued) / ideal,
        "peak_per_key": max(peak(runs) for runs in by_key.values()),
        "handoff_p50_ms": 1000 * gaps[len(gaps) // 2],
        "handoff_p90_ms": 1000 * gaps[len(gaps) * 9 // 10],
    }


def handoffs(runs: list[tuple[float, float]]) -> list[float]:
    """For each run of a key after the first CAP: how long after a place of its key
    freed (the end that left room for it) it started."""
    ordered = sorted(runs)
    gaps = []
    for index in range(CAP, len(ordered)):
        ends = sorted(end for _, end in ordered[:index])
        gaps.append(ordered[index][0] - ends[index - CAP])
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    fleet_arguments(parser)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=0.5)
    options = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
    try:
        for round_number in range(options.rounds):
            order = VARIANTS if round_number % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                result = run(variant, options)
                results[variant].append(result)
                shown = ", ".join(f"{name} {value:,.3f}" for name, value in result.items())
                print(f"round {round_number + 1} {variant}: {shown}", file=sys.stderr)
    finally:
        with psycopg.connect(admin_dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DBNAME}" WITH (FORCE)')
    report(results, options)


def report(results: dict[str, list[dict[str, float]]], options: argparse.Namespace) -> None:
    ideal = options.jobs / options.keys / CAP * options.seconds
    print(
        f"| variant ({options.jobs:,} jobs of {options.seconds:g} s over {options.keys} keys, "
        f"median of {options.rounds}) | time to the last end | vs ideal ({ideal:.2f} s) "
        "| most running per key (max over the rounds) | hand-off p50 / p90 |"
    )
    print("|---|---:|---:|---:|---:|")
    for variant in VARIANTS:
        elapsed = statistics.median(result["elapsed"] for result in results[variant])
        most = max(result["peak_per_key"] for result in results[variant])
        p50 = statistics.median(result["handoff_p50_ms"] for result in results[variant])
        p90 = statistics.median(result["handoff_p90_ms"] for result in results[variant])
        print(
            f"| {variant} | {elapsed:.2f} s | {elapsed / ideal:.3f} | {most:.0f} "
            f"| {p50:.0f} / {p90:.0f} ms |"
        )


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "enqueue":
        enqueue(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    else:
        main()
