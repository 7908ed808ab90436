"""Fair claiming (issue 34): does a flooded queue hold back another? Does one account's
backlog hold back other accounts' jobs of a fair kind?

    python benchmarks/fairness.py                    # 1,000,000 backlog, 5 rounds (~6 min)
    python benchmarks/fairness.py --backlog 100000 --rounds 1   # a quick look
    python benchmarks/fairness.py --tenants          # 100,000 for one account, then 1 each for 100

With `--tenants` the backlog is `--backlog` (100,000 by default) `bench.fair` jobs
(`fair_by="key"`) of one account in queue `default`, and the newcomers are one job
each for 100 other accounts of the same kind and queue.

Each round runs two variants, in alternating order, each on a fresh backlog of
`--backlog` due `bench.sink` jobs in queue `bulk` (inserted by SQL, then
ANALYZE), drained by one `venturi_worker` at its defaults (every queue,
concurrency 10, batch 500). Once the worker has run `--warm-up` jobs, a child
process enqueues:
  shared   100 `bench.sink` jobs in queue `default` (the same priority tier);
  alone    nothing (the same child, so both variants pay for it).
From the handlers' own timestamps (the sink) it prints, per variant, the median
over the rounds of: the bulk jobs run per second in the `--window` seconds from
that moment; the worker's CPU time per job in that window; and, for `shared`,
how long after their enqueue began the `default` jobs started (p50 and p100).
Targets: p100 within 2 s, and `shared`'s bulk rate at least 90 % of `alone`'s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.flow_control import admin_dsn, env, fresh_database  # noqa: E402
from benchmarks.sink import SinkReader  # noqa: E402

DBNAME = "venturi_bench_fairness"
VARIANTS = ("alone", "shared")
NEWCOMERS = 100
FIRST_NEWCOMER = 90_000_000
"""The sink index of the first `default` job (the backlog's are 0 up to the backlog size)."""
TICKS = os.sysconf("SC_CLK_TCK")

_BACKLOG = """
INSERT INTO django_venturi_job (kind, queue, priority, rank, state, payload, attempt, failures,
                                enqueued_at, run_at, merged_count, claimed_by, waiting_for,
                                last_error, fair_key)
SELECT %(kind)s, %(queue)s, 1, 0, 'ready', jsonb_build_object('i', g, 'key', 'big'), 0, 0,
       now(), now() - interval '1 hour', 0, '', 0, '', %(fair_key)s
FROM generate_series(0, %(backlog)s - 1) AS g
"""


def fill(backlog: int, tenants: bool) -> None:
    params = {
        "kind": "bench.fair" if tenants else "bench.sink",
        "queue": "default" if tenants else "bulk",
        "fair_key": "big" if tenants else None,
        "backlog": backlog,
    }
    with psycopg.connect(admin_dsn(DBNAME), autocommit=True) as conn:
        conn.execute("TRUNCATE django_venturi_job, django_venturi_journalentry CASCADE")
        conn.execute(_BACKLOG, params)
        conn.execute("ANALYZE django_venturi_job")


def enqueue_newcomers(count: int, tenants: bool) -> None:
    """Run in a child process with Django set up: enqueue `count` jobs in `default` (one
    each for `count` other accounts, with `tenants`) and print the wall-clock time the
    enqueue began."""
    import django

    django.setup()
    import django_venturi as venturi
    from benchmarks.bench_project.benchapp import tasks

    jobs: list[venturi.Task] = [
        tasks.FairJob(i=FIRST_NEWCOMER + k, key=f"t{k:03}")  # type: ignore[attr-defined]
        if tenants
        else tasks.SinkJob(i=FIRST_NEWCOMER + k)
        for k in range(count)
    ]
    began = time.time()
    venturi.enqueue_many(jobs, queue="default")
    print(began)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def run(variant: str, options: argparse.Namespace) -> dict[str, float]:
    fill(options.backlog, options.tenants)
    with tempfile.TemporaryDirectory() as tmp:
        sink = SinkReader(str(Path(tmp) / "sink"))
        worker = subprocess.Popen(
            [sys.executable, "-m", "django", "venturi_worker", "-v", "0"],
            env=env(Path(sink.path), fair=options.tenants, dbname=DBNAME),
            cwd=REPO_ROOT,
        )
        try:
            deadline = time.monotonic() + 120
            while sink.poll() < options.warm_up:
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError(f"{variant}: the worker did not warm up")
                time.sleep(0.01)
            began, cpu_before = time.time(), cpu_seconds(worker.pid)
            count = NEWCOMERS if variant == "shared" else 0
            child = subprocess.run(
                [sys.executable, str(Path(__file__)), "enqueue", str(count)]
                + (["tenants"] if options.tenants else []),
                env=env(fair=options.tenants, dbname=DBNAME),
                cwd=REPO_ROOT,
                check=True,
                capture_output=True,
                text=True,
            )
            enqueued = float(child.stdout.split()[-1])
            time.sleep(max(0.0, began + options.window - time.time()))
            cpu_after = cpu_seconds(worker.pid)
            sink.poll()
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    ended = began + options.window
    starts = {i: min(times) for i, times in sink.times.items()}
    in_window = [i for i, at in starts.items() if began <= at < ended]
    bulk = sum(1 for i in in_window if i < FIRST_NEWCOMER)
    result = {
        "bulk_rate": bulk / options.window,
        "cpu_ms_per_job": 1000 * (cpu_after - cpu_before) / max(1, len(in_window)),
    }
    if count:
        waits = sorted(
            starts.get(FIRST_NEWCOMER + k, float("inf")) - enqueued for k in range(count)
        )
        result["p50"] = waits[len(waits) // 2]
        result["p100"] = waits[-1]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=None)
    parser.add_argument(
        "--tenants", action="store_true", help="one account's backlog of a fair kind"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm-up", type=int, default=20_000)
    parser.add_argument("--window", type=float, default=None)
    options = parser.parse_args()
    if options.backlog is None:
        options.backlog = 100_000 if options.tenants else 1_000_000
    if options.window is None:  # the account's backlog lasts about 10 s at defaults
        options.window = 5.0 if options.tenants else 10.0
    fresh_database(DBNAME)
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
    def median(variant: str, name: str) -> float:
        return statistics.median(result[name] for result in results[variant])

    alone = median("alone", "bulk_rate")
    print(
        f"| variant ({options.backlog:,} in {'one account' if options.tenants else 'bulk'}, "
        f"median of {options.rounds}) | backlog jobs/s "
        f"| vs alone | CPU ms/job | {NEWCOMERS} {'accounts' if options.tenants else 'default'} "
        "jobs started after (p50 / p100) |"
    )
    print("|---|---:|---:|---:|---:|")
    for variant in VARIANTS:
        rate = median(variant, "bulk_rate")
        waits = (
            f"{median(variant, 'p50'):.2f} s / {median(variant, 'p100'):.2f} s"
            if variant == "shared"
            else "-"
        )
        print(
            f"| {variant} | {rate:,.0f} | {rate / alone:.2f} "
            f"| {median(variant, 'cpu_ms_per_job'):.3f} | {waits} |"
        )
    worst = max(result["p100"] for result in results["shared"])
    print(f"\nworst p100 over the rounds: {worst:.2f} s")


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "enqueue":
        enqueue_newcomers(int(sys.argv[2]), tenants=sys.argv[3:] == ["tenants"])
    else:
        main()
