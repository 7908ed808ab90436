"""Worker processes started and left idle before the jobs come (key_caps.py, rate_limits.py).

`idle_fleet` starts `count` `venturi_worker` processes on a benchmark database, waits
until each has registered and a second more (each is listening and idle), and
terminates them at the end. `enqueue_in_child` runs a benchmark's own `enqueue` entry
point in a child process with Django set up and returns the wall-clock time its enqueue
began (the child prints it last). `fleet_arguments` adds their shared options.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from benchmarks.flow_control import REPO_ROOT, admin_dsn


def live_workers(dbname: str) -> int:
    with psycopg.connect(admin_dsn(dbname), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM django_venturi_workerprocess WHERE stopped_at IS NULL"
        ).fetchone()
    return int(row[0]) if row else 0


@contextlib.contextmanager
def idle_fleet(count: int, concurrency: int, env: dict[str, str], dbname: str) -> Iterator[None]:
    command = [sys.executable, "-m", "django", "venturi_worker", "-v", "0"]
    command += ["--concurrency", str(concurrency)]
    workers = [subprocess.Popen(command, env=env, cwd=REPO_ROOT) for _ in range(count)]
    try:
        deadline = time.monotonic() + 60
        while live_workers(dbname) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} workers did not start")
            time.sleep(0.05)
        time.sleep(1.0)  # each is listening and idle
        yield
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=60)


def enqueue_in_child(script: Path, arguments: list[str], env: dict[str, str]) -> float:
    child = subprocess.run(
        [sys.executable, str(script), "enqueue", *arguments],
        env=env,
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(child.stdout.split()[-1])


def fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """--rounds (5), --workers (8), --concurrency (8) and --jobs (1,000)."""
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=1000)
