"""Workflow benchmarks: a chain's per-step latency, and a group's throughput and callback.

    python benchmarks/workflows.py                  # a chain of 1,000, a group of 10,000
    python benchmarks/workflows.py --steps 200 --members 2000   # smaller

Each case gets a fresh database (`venturi_bench_workflows_*`), migrated, filled
by `benchmarks.producer` and drained by real `venturi_worker` processes. The
figures come from the database afterwards (`started_at` is a run's handler
start, `finished_at` its verdict's time, both database time):

- chain: for each step after the first, its start minus the previous step's
  finish: the time the last verdict's transaction, the wake-up and the claim
  take. p50 and p95.
- group: the members' throughput (first start to last finish) beside a plain
  drain of as many jobs with the same workers, and the callback's start minus
  the last member's finish.

It needs what `run.py` needs (PostgreSQL at 127.0.0.1:5432, `--host`, `--port`,
`--user` to change that) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from datetime import datetime
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR.parent) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR.parent))

import psycopg  # noqa: E402

from benchmarks.config import WORK_DIR, Cell, Options  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    child_env,
    dsn,
    fresh_database,
    migrate,
    produce,
    spawned,
    venturi_workers,
)
from benchmarks.latency import percentile  # noqa: E402

WORKERS = Cell(processes=2, concurrency=32, verbosity=0)
"""The workers of the group and plain drains (the chain runs one job at a time anyway)."""
DEADLINE = 600.0
"""Seconds a drain may take before the benchmark gives up."""


@dataclasses.dataclass(frozen=True)
class Timed:
    """One job's run as the database recorded it."""

    id: int
    started_at: datetime
    finished_at: datetime


def options_for(args: argparse.Namespace) -> Options:
    return Options(
        n=0,
        repeat=1,
        grid=[],
        wake_count=0,
        wake_settle=0.0,
        analyze=True,
        workloads=set(),
        dsn_base={"host": args.host, "port": str(args.port), "user": args.user},
        quick=False,
        output=WORK_DIR / "workflows.md",
    )


def drained(options: Options, name: str, mode: str, n: int, cell: Cell) -> list[Timed]:
    """Enqueue `n` steps in `mode` on a fresh database, run workers until the last job
    completes, and return every job's times, in id order."""
    with fresh_database(options, f"workflows_{name}") as dbname:
        migrate(options, dbname)
        produced = produce(options, dbname, mode, "--n", str(n))
        env = child_env(options, dbname)
        with spawned(venturi_workers(cell), env, WORK_DIR / f"workflows_{name}"):
            wait_completed(options, dbname, produced["last"])
        return times(options, dbname)


def wait_completed(options: Options, dbname: str, job_id: int) -> None:
    deadline = time.monotonic() + DEADLINE
    with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT state FROM django_venturi_job WHERE id = %s", [job_id]
            ).fetchone()
            if row and row[0] == "completed":
                return
            if row and row[0] in ("failed", "cancelled"):
                raise RuntimeError(f"job {job_id} ended {row[0]}")
            time.sleep(0.05)
    raise RuntimeError(f"job {job_id} did not complete within {DEADLINE:.0f} s")


def times(options: Options, dbname: str) -> list[Timed]:
    with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, started_at, finished_at FROM django_venturi_job "
            "WHERE state = 'completed' ORDER BY id"
        ).fetchall()
    return [Timed(*row) for row in rows]


def chain_latencies_ms(steps: list[Timed]) -> list[float]:
    """Each step's start after its predecessor's finish, in ms."""
    return [
        (step.started_at - before.finished_at).total_seconds() * 1000
        for before, step in itertools.pairwise(steps)
    ]


def throughput(jobs: list[Timed]) -> float:
    """Jobs per second from the first start to the last finish."""
    span = max(job.finished_at for job in jobs) - min(job.started_at for job in jobs)
    return len(jobs) / max(span.total_seconds(), 1e-9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1000, help="chain length (1,000)")
    parser.add_argument("--members", type=int, default=10_000, help="group size (10,000)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", default="5432")
    parser.add_argument("--user", default="postgres")
    args = parser.parse_args(argv)
    options = options_for(args)
    WORK_DIR.mkdir(parents=True, exist_ok=True)

    chain = drained(options, "chain", "chain", args.steps, Cell(processes=1, verbosity=0))
    latencies = chain_latencies_ms(chain)
    plain = drained(options, "plain", "steps", args.members, WORKERS)
    group = drained(options, "group", "group", args.members, WORKERS)
    members, callback = group[:-1], group[-1]
    callback_delay = (callback.started_at - max(m.finished_at for m in members)).total_seconds()

    plain_rate, members_rate = throughput(plain), throughput(members)
    rows = [
        (f"chain of {len(chain):,}: per-step latency p50", f"{percentile(latencies, 0.5):.1f} ms"),
        (f"chain of {len(chain):,}: per-step latency p95", f"{percentile(latencies, 0.95):.1f} ms"),
        (f"plain drain of {len(plain):,} ({WORKERS.label()})", f"{plain_rate:,.0f} jobs/s"),
        (
            f"group of {len(members):,}: members",
            f"{members_rate:,.0f} jobs/s ({members_rate / plain_rate:.0%} of plain)",
        ),
        (
            f"group of {len(members):,}: callback start after the last member",
            f"{callback_delay * 1000:.1f} ms",
        ),
    ]
    print(f"| workflows, {time.strftime('%Y-%m-%d %H:%M')} | figure |")
    print("|---|---:|")
    for what, figure in rows:
        print(f"| {what} | {figure} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
