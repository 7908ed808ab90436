"""Churn: the job table's health under a steady drain and enqueue, with and without the
storage parameters of the job table's migration (`0019_job_table_storage`).

    python -m benchmarks.churn                      # 5 minutes, 100 jobs/s, both variants
    python -m benchmarks.churn --minutes 60 --rate 200

Each variant gets a fresh, migrated database (`venturi_churn_<variant>`): `shipped`
keeps the migration's parameters, `fillfactor` adds `fillfactor = 80` to them (room
for HOT updates), `none` resets them to the server's defaults. All start from the
same history (`--history` completed jobs: what retention keeps in a real
deployment), packed and analysed.
Then, side by side for the same minutes, each runs one `venturi_worker` draining
a producer that enqueues `--rate` jobs a second and deletes the jobs it enqueued
once finished `--keep` seconds ago (retention of the new jobs only: the history
stays). No manual vacuum: what is reclaimed, autovacuum reclaims. The server is a
private cluster with PostgreSQL's default configuration, made for the run as
`tests/clusters.py` makes them (root and postgresql-common); `--shared-server`
uses the one at VENTURI_BENCH_HOST:PORT as it is configured instead.

Every `--sample` seconds it reads, per variant: dead and live tuples, the table's
and its indexes' size, the share of updates that were HOT, autovacuum and
autoanalyze runs, and the claim's cost: the claim index's probe (ready jobs of a
queue in claim order, `LIMIT 10`) under `EXPLAIN (ANALYZE, BUFFERS)`, its buffers
and milliseconds (median of 5). At the end, CPU time per job of the worker and of
the PostgreSQL backends of its database (from /proc). It prints one table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "benchmarks.bench_project.settings"
TABLE = "django_venturi_job"
PREFIX = "venturi_churn_"
VARIANTS = ("shipped", "fillfactor", "none")
PARAMETERS = (
    "fillfactor",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_insert_threshold",
    "autovacuum_analyze_scale_factor",
    "autovacuum_analyze_threshold",
)
CLAIM_PROBE = (
    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM django_venturi_job "
    "WHERE state = 'ready' AND queue = 'default' ORDER BY priority, rank, run_at, id LIMIT 10"
)
HEALTH = """
SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count, autoanalyze_count,
       pg_table_size(relid), pg_indexes_size(relid)
FROM pg_stat_user_tables WHERE relname = %s
"""


@dataclasses.dataclass
class Sample:
    minute: float
    live: int
    dead: int
    hot_ratio: float
    autovacuums: int
    autoanalyzes: int
    table_mb: float
    index_mb: float
    claim_buffers: int
    claim_ms: float


def dsn(dbname: str) -> str:
    host = os.environ.get("VENTURI_BENCH_HOST", "127.0.0.1")
    port = os.environ.get("VENTURI_BENCH_PORT", "5432")
    return f"host={host} port={port} user=postgres dbname={dbname}"


def child_env(dbname: str) -> dict[str, str]:
    env = dict(os.environ, VENTURI_BENCH_DB=dbname, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["DJANGO_SETTINGS_MODULE"] = SETTINGS
    return env


def prepare(variant: str, history: int) -> str:
    """A fresh migrated database with `history` completed jobs, vacuumed and analysed."""
    dbname = PREFIX + variant
    with psycopg.connect(dsn("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    argv = [sys.executable, "-m", "django", "migrate", "-v", "0"]
    subprocess.run(argv, env=child_env(dbname), check=True)
    argv = [sys.executable, "-m", "benchmarks.churn", "history", str(history)]
    subprocess.run(argv, env=child_env(dbname), check=True)
    with psycopg.connect(dsn(dbname), autocommit=True) as conn:
        if variant == "none":
            conn.execute(f"ALTER TABLE {TABLE} RESET ({', '.join(PARAMETERS)})")
        elif variant == "fillfactor":
            conn.execute(f"ALTER TABLE {TABLE} SET (fillfactor = 80)")
        conn.execute(f"VACUUM (FULL, ANALYZE) {TABLE}")  # both start from packed pages
        conn.execute("SELECT pg_stat_reset()")
    return dbname


def sample(conn: psycopg.Connection[Any], started: float) -> Sample:
    row = conn.execute(HEALTH, [TABLE]).fetchone()
    assert row is not None
    live, dead, updates, hot, vacuums, analyzes, table, indexes = row
    probes = [conn.execute(CLAIM_PROBE).fetchone()[0][0] for _ in range(5)]  # type: ignore[index]
    return Sample(
        minute=(time.monotonic() - started) / 60,
        live=live,
        dead=dead,
        hot_ratio=hot / updates if updates else 0.0,
        autovacuums=vacuums,
        autoanalyzes=analyzes,
        table_mb=table / 2**20,
        index_mb=indexes / 2**20,
        claim_buffers=int(statistics.median(_buffers(probe["Plan"]) for probe in probes)),
        claim_ms=statistics.median(probe["Execution Time"] for probe in probes),
    )


def _buffers(plan: dict[str, Any]) -> int:
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backends(conn: psycopg.Connection[Any], dbname: str) -> set[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [dbname]
    )
    return {pid for (pid,) in rows}


def churn(options: argparse.Namespace) -> dict[str, list[Sample]]:
    databases = {variant: prepare(variant, options.history) for variant in options.variants}
    samples: dict[str, list[Sample]] = {variant: [] for variant in databases}
    processes: dict[str, list[subprocess.Popen[bytes]]] = {}
    seconds = options.minutes * 60
    worker = [sys.executable, "-m", "django", "venturi_worker", "--concurrency", "8", "-v", "0"]
    producer = [sys.executable, "-m", "benchmarks.churn", "produce", str(options.rate)]
    for variant, dbname in databases.items():
        env = child_env(dbname)
        producing = [*producer, str(seconds), str(options.keep)]
        processes[variant] = [
            subprocess.Popen(worker, env=env),
            subprocess.Popen(producing, env=env),
        ]
    readers = {v: psycopg.connect(dsn(db), autocommit=True) for v, db in databases.items()}
    cpu: dict[str, dict[int, float]] = {variant: {} for variant in databases}
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            time.sleep(min(options.sample, max(0.0, seconds - (time.monotonic() - started))))
            for variant, conn in readers.items():
                samples[variant].append(sample(conn, started))
                for pid in [processes[variant][0].pid, *backends(conn, databases[variant])]:
                    cpu[variant][pid] = max(cpu[variant].get(pid, 0.0), cpu_seconds(pid))
                print(f"{variant}: {samples[variant][-1]}", file=sys.stderr, flush=True)
    finally:
        for running in processes.values():
            for process in running:
                process.send_signal(signal.SIGTERM)
            for process in running:
                process.wait(timeout=60)
    for variant, conn in readers.items():
        done = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE id > 0").fetchone()
        jobs = conn.execute("SELECT count(*) FROM django_venturi_journalentry").fetchone()
        total = sum(cpu[variant].values())
        print(f"{variant}: rows {done}, journal {jobs}, cpu {total:.1f} s", file=sys.stderr)
        conn.close()
    report(samples, cpu, options)
    return samples


def report(
    samples: dict[str, list[Sample]], cpu: dict[str, dict[int, float]], options: argparse.Namespace
) -> None:
    jobs = options.rate * options.minutes * 60
    with psycopg.connect(dsn("postgres")) as conn:
        server = conn.execute("SELECT version()").fetchone()
        autovacuum = conn.execute("SHOW autovacuum").fetchone()
    print(
        f"\nChurn: {options.minutes} min at {options.rate} jobs/s, {options.history:,} "
        f"completed jobs of history, new jobs deleted {options.keep} s after they finish\n"
        f"{server[0] if server else ''}, autovacuum {autovacuum[0] if autovacuum else ''}\n"
    )
    print(
        "| variant | minute | live | dead | HOT updates | autovacuums | table MB "
        "| indexes MB | claim buffers | claim ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for variant, rows in samples.items():
        for row in rows:
            print(
                f"| {variant} | {row.minute:.1f} | {row.live:,} | {row.dead:,} "
                f"| {row.hot_ratio:.0%} | {row.autovacuums}/{row.autoanalyzes} "
                f"| {row.table_mb:.1f} | {row.index_mb:.1f} | {row.claim_buffers} "
                f"| {row.claim_ms:.3f} |"
            )
    print("\n| variant | table+indexes, last / first sample | CPU ms per job (worker + backends) |")
    print("|---|---:|---:|")
    for variant, rows in samples.items():
        if not rows:
            continue
        first, last = rows[0], rows[-1]
        growth = (last.table_mb + last.index_mb) / (first.table_mb + first.index_mb)
        per_job = sum(cpu[variant].values()) * 1000 / jobs
        print(f"| {variant} | {growth:.2f}x | {per_job:.2f} |")


def history(count: int) -> None:
    """Insert `count` completed jobs (a copy of one real completed job, the history)."""
    import django

    django.setup()
    from django.db import connection

    from benchmarks.bench_project.benchapp.tasks import StepJob

    first = StepJob(i=0).enqueue()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET state = 'completed', finished_at = now() WHERE id = %s", [first.id]
        )
        cursor.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = %s AND column_name <> 'id'",
            [TABLE],
        )
        columns = ", ".join(f'"{name}"' for (name,) in cursor.fetchall())
        cursor.execute(
            f"INSERT INTO {TABLE} ({columns}) SELECT {columns} FROM {TABLE}, "
            "generate_series(2, %s) WHERE id = %s",
            [count, first.id],
        )


def produce(rate: int, seconds: float, keep: float) -> None:
    """Enqueue `rate` jobs a second for `seconds`, in ten batches a second, on an
    absolute schedule; once a second delete the jobs enqueued here that finished more
    than `keep` seconds ago."""
    import django

    django.setup()
    from datetime import timedelta

    from django.db.models.functions import Now

    import django_venturi as venturi
    from benchmarks.bench_project.benchapp.tasks import StepJob
    from django_venturi.models import Job
    from django_venturi.store.retention import delete_jobs

    floor = Job.objects.order_by("-id").values_list("id", flat=True).first() or 0
    per_tick = max(1, rate // 10)
    started = time.monotonic()
    tick = 0
    while (due := started + tick * 0.1) < started + seconds:
        time.sleep(max(0.0, due - time.monotonic()))
        venturi.enqueue_many([StepJob(i=tick * per_tick + k) for k in range(per_tick)])
        tick += 1
        if tick % 10 == 0:
            old = Job.objects.filter(
                id__gt=floor, state="completed", finished_at__lt=Now() - timedelta(seconds=keep)
            )
            ids = list(old.values_list("id", flat=True)[:5000])
            if ids:
                delete_jobs(Job.objects.filter(id__in=ids), using="default")


def main(argv: list[str]) -> None:
    if argv[:1] == ["history"]:
        return history(int(argv[1]))
    if argv[:1] == ["produce"]:
        return produce(int(argv[1]), float(argv[2]), float(argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=100, help="jobs enqueued per second")
    parser.add_argument("--history", type=int, default=200_000, help="completed jobs kept")
    parser.add_argument("--keep", type=float, default=60.0, help="seconds new jobs are kept")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--variants", type=lambda text: text.split(","), default=list(VARIANTS))
    parser.add_argument("--json", type=Path, help="also write the samples here")
    parser.add_argument(
        "--shared-server",
        action="store_true",
        help="use the server at VENTURI_BENCH_HOST:PORT as it is configured (autovacuum "
        "may be off there) instead of a private cluster with PostgreSQL's defaults",
    )
    options = parser.parse_args(argv)
    if options.shared_server:
        samples = churn(options)
    else:
        from tests.clusters import private_cluster

        with private_cluster("churn") as cluster:
            os.environ["VENTURI_BENCH_HOST"] = "127.0.0.1"
            os.environ["VENTURI_BENCH_PORT"] = str(cluster.port)
            samples = churn(options)
    if options.json:
        options.json.write_text(
            json.dumps({v: [dataclasses.asdict(s) for s in rows] for v, rows in samples.items()})
        )


if __name__ == "__main__":
    main(sys.argv[1:])
