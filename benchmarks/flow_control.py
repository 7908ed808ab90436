"""Flow control's cost to everyone else: a plain drain with and without a rate-limited
kind, and with and without a paused queue, present in the same database.

    python benchmarks/flow_control.py               # N = 10,000, 3 rounds
    python benchmarks/flow_control.py --n 2000 --rounds 1

Each round runs every variant once, in turn, each in a fresh database: N no-op
`bench.sink` jobs drained by one `venturi_worker --concurrency 32 -v 0`.
  plain     nothing else;
  limited   `bench.limited` (10 a second) registered, 200 of its jobs in the same queue;
  paused    a paused queue holding 200 jobs;
  keyed     `bench.key_capped` (2 running per key) registered, 200 of its jobs over 20
            keys in the same queue;
  fair_beside  `bench.fair` (turns by key) registered, 200 of its jobs over 20 keys in
            the same queue;
  fair      the N jobs are `bench.fair` jobs over 100 keys (a fair kind's own drain);
  history_off  plain with `VENTURI["HISTORY"]` off: the cost of writing the history
            roll-ups is plain's against this one (`--variants plain,history_off --rounds 5`).
  no_live_index  plain without the live jobs' index (`venturi_job_live_idx`, dropped
            after the migrations): its cost to a drain is plain's against this one
            (`--variants plain,no_live_index --rounds 5`).
FLOW_EXTRA=0 leaves those 200 jobs out (the limited kind is only registered).
It prints, per variant, the median steady drain rate (from the handlers' own
timestamps, the 10th to the last job) and the transactions the database
committed per job during the drain (flow control must add no query per job) and
the worker's CPU time per job in the steady part (less noisy than the rate on a
shared machine).
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

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sink import SinkReader

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SETTINGS = "benchmarks.bench_project.settings"
DBNAME = "venturi_bench_flow" + os.environ.get("VENTURI_TEST_RUN", "")  # side by side runs
VARIANTS = (
    "plain",
    "limited",
    "paused",
    "keyed",
    "fair_beside",
    "fair",
    "history_off",
    "no_live_index",
)
EXTRA_JOBS = int(os.environ.get("FLOW_EXTRA", "200"))


def admin_dsn(dbname: str = "postgres") -> str:
    return psycopg.conninfo.make_conninfo(
        host=os.environ.get("VENTURI_BENCH_HOST", "127.0.0.1"),
        port=os.environ.get("VENTURI_BENCH_PORT", "5432"),
        user=os.environ.get("VENTURI_BENCH_USER", "postgres"),
        dbname=dbname,
    )


def env(
    sink: Path | None = None,
    *,
    limited: bool = False,
    keyed: bool = False,
    fair: bool = False,
    rated: bool = False,
    history: bool = True,
    dbname: str = DBNAME,
) -> dict[str, str]:
    values = dict(os.environ)
    values["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), values.get("PYTHONPATH", "")])
    values["VENTURI_BENCH_DB"] = dbname
    values["DJANGO_SETTINGS_MODULE"] = SETTINGS
    values.pop("VENTURI_BENCH_RATE_LIMITED", None)
    if limited:
        values["VENTURI_BENCH_RATE_LIMITED"] = "1"
    values.pop("VENTURI_BENCH_KEY_CAPPED", None)
    if keyed:
        values["VENTURI_BENCH_KEY_CAPPED"] = "1"
    values.pop("VENTURI_BENCH_FAIR", None)
    if fair:
        values["VENTURI_BENCH_FAIR"] = "1"
    values.pop("VENTURI_BENCH_RATED", None)
    if rated:
        values["VENTURI_BENCH_RATED"] = "1"
    values.pop("VENTURI_BENCH_HISTORY", None)
    if not history:
        values["VENTURI_BENCH_HISTORY"] = "0"
    if sink is not None:
        values["VENTURI_BENCH_SINK"] = str(sink)
    return values


def fresh_database(dbname: str = DBNAME) -> None:
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        env=env(dbname=dbname),
        check=True,
        cwd=REPO_ROOT,
    )


def produce(variant: str, n: int) -> None:
    """Run in a child process with Django set up: enqueue the variant's backlog."""
    import django

    django.setup()
    import django_venturi as venturi
    from benchmarks.bench_project.benchapp import tasks

    for start in range(0, n, 1000):
        indexes = range(start, min(n, start + 1000))
        if variant == "fair":
            venturi.enqueue_many([tasks.FairJob(i=i, key=f"k{i % 100}") for i in indexes])  # type: ignore[attr-defined]
        else:
            venturi.enqueue_many([tasks.SinkJob(i=i) for i in indexes])
    if variant == "fair_beside":
        beside = [tasks.FairJob(i=n + i, key=f"k{i % 20}") for i in range(EXTRA_JOBS)]  # type: ignore[attr-defined]
        venturi.enqueue_many(beside)
    if variant == "limited":
        venturi.enqueue_many([tasks.LimitedJob(i=i) for i in range(EXTRA_JOBS)])  # type: ignore[attr-defined]
    if variant == "keyed":
        capped = [tasks.KeyCappedJob(i=i, key=i % 20, seconds=0) for i in range(EXTRA_JOBS)]  # type: ignore[attr-defined]
        venturi.enqueue_many(capped)
    if variant == "paused":
        venturi.pause(queue="held")
        venturi.enqueue_many([tasks.SinkJob(i=n + i) for i in range(EXTRA_JOBS)], queue="held")


def committed() -> int:
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [DBNAME]
        ).fetchone()
        conn.execute("SELECT pg_stat_clear_snapshot()")
    assert row is not None
    return int(row[0])


def drain(variant: str, n: int) -> tuple[float, float, float]:
    """One variant once: (steady jobs per second, transactions committed per job, the
    worker's CPU milliseconds per job in the steady part)."""
    fresh_database()
    if variant == "no_live_index":
        with psycopg.connect(admin_dsn(DBNAME), autocommit=True) as conn:
            conn.execute("DROP INDEX venturi_job_live_idx")
    subprocess.run(
        [sys.executable, str(Path(__file__)), "produce", variant, str(n)],
        env=variant_env(variant),
        check=True,
        cwd=REPO_ROOT,
    )
    first = n // 10
    with tempfile.TemporaryDirectory() as tmp:
        sink = SinkReader(str(Path(tmp) / "sink"))
        time.sleep(0.6)  # the statistics collector's view of the database settles
        before = committed()
        worker = subprocess.Popen(
            [sys.executable, "-m", "django", "venturi_worker", "--concurrency", "32", "-v", "0"],
            env=variant_env(variant, Path(sink.path)),
            cwd=REPO_ROOT,
        )
        try:
            deadline = time.monotonic() + 120
            cpu_from = done = 0
            # The sink jobs are 0 to n - 1 (the keyed variant's jobs write theirs too).
            while done < n:
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError(f"{variant}: the drain did not finish")
                time.sleep(0.01)
                sink.poll()
                done = sum(1 for i in sink.times if i < n)
                if not cpu_from and done > first:
                    cpu_from, counted_from = cpu_seconds(worker.pid), done
            cpu = cpu_seconds(worker.pid) - cpu_from
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        time.sleep(0.6)
        after = committed()
        times = sorted(min(at) for i, at in sink.times.items() if i < n)
    rate = (n - 1 - first) / (times[-1] - times[first])
    return rate, (after - before) / n, 1000 * cpu / max(1, n - counted_from)


def variant_env(variant: str, sink: Path | None = None) -> dict[str, str]:
    """The environment of a variant's processes: its extra kind registered."""
    return env(
        sink,
        limited=variant == "limited",
        keyed=variant == "keyed",
        fair=variant in ("fair", "fair_beside"),
        history=variant != "history_off",
    )


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=list(VARIANTS),
        help="comma-separated, of: " + ", ".join(VARIANTS),
    )
    options = parser.parse_args()
    variants = [variant for variant in VARIANTS if variant in options.variants]
    results: dict[str, list[tuple[float, float, float]]] = {variant: [] for variant in variants}
    for round_number in range(options.rounds):
        for variant in variants:
            results[variant].append(drain(variant, options.n))
            rate, per_job, cpu = results[variant][-1]
            print(
                f"round {round_number + 1} {variant}: {rate:,.0f} jobs/s, "
                f"{per_job:.3f} transactions per job, {cpu:.3f} worker CPU ms per job",
                file=sys.stderr,
            )
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DBNAME}" WITH (FORCE)')
    first = statistics.median(result[0] for result in results[variants[0]])
    print(
        f"| variant ({options.n:,} jobs, median of {options.rounds}) | jobs/s | vs {variants[0]} "
        "| transactions per job | worker CPU ms per job |"
    )
    print("|---|---:|---:|---:|---:|")
    for variant in variants:
        rate, per_job, cpu = (
            statistics.median(result[index] for result in results[variant]) for index in range(3)
        )
        print(f"| {variant} | {rate:,.0f} | {rate / first:.2f} | {per_job:.3f} | {cpu:.3f} |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "produce":
        produce(sys.argv[2], int(sys.argv[3]))
    else:
        main()
