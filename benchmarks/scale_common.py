"""What the scale workloads of `scale.py` (issue #17) share: constants, options,
records, and their databases, producers and drains.

`ScaleOptions` extends run.py's `Options` (`config.py`); `Measured`, `Reading`, `ClaimCount` and
`Results` hold what the phases measure. `scale_database` is a fresh, migrated
database `venturi_scale_<name>`; `produce` runs `python -m benchmarks.scale produce`
(`scale_producer.py`); `measured_drain` is the W2 drain of `harness.py` plus the
database sessions opened meanwhile; `wait_until` polls a condition while workers run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from benchmarks import harness
from benchmarks.config import DEFAULTS, RESULTS_DIR, Cell, Options
from benchmarks.harness import (
    SINK_POLL,
    VENTURI_DONE_ONCE,
    VENTURI_UNFINISHED,
    admin,
    child_env,
    drain,
    dsn,
    migrate,
    run_json,
    venturi_workers,
)
from benchmarks.results import Drain

WORK_DIR = RESULTS_DIR / "scale_run"
DB_PREFIX = "venturi_scale_"
WORKLOADS = ("w5", "w9", "claims", "payload")

DRAIN_CELL = Cell(1, 32, None, 0)
"""One process, concurrency 32, -v 0: W5's first cell, the payload drains, W9's unit."""
W5_CELLS = (DRAIN_CELL, DEFAULTS)
W5_RATIO_TARGET = 0.60
"""W5: the ORM drain at no less than 60 % of the no-op drain's rate."""
W9_PROCESSES = (1, 2, 4, 8)
W9_RATIO_TARGET = 0.80
"""W9: 8 processes at no less than 80 % of the best process count."""
CLAIMS_TARGET = 2.0
"""Claim statements per enqueue with eight idle workers: at most 2."""
STATS_SETTLE = 0.6
"""The cumulative statistics of a backend that went idle or exited reach the view
within about a second; read, wait this long, read again until two reads agree."""

SESSIONS_READ = "SELECT sessions, xact_commit FROM pg_stat_database WHERE datname = %s"


@dataclasses.dataclass
class ScaleOptions(Options):
    w9_n: int = 20_000
    w9_processes: tuple[int, ...] = W9_PROCESSES
    w5_cells: tuple[Cell, ...] = W5_CELLS
    claim_jobs: int = 20
    claim_interval: float = 0.2
    claim_tail: float = 1.0
    """Seconds after the last paced enqueue before the window closes."""
    counter_rows: int = 1_000

    def artifact(self, name: str) -> Path:
        return WORK_DIR / name

    @property
    def claim_window(self) -> float:
        return self.claim_jobs * self.claim_interval + self.claim_tail


# ---------------------------------------------------------------- results


@dataclasses.dataclass
class Measured:
    """One drain and what was read around it."""

    drain: Drain
    enqueue_rate: float | None = None
    sessions: int | None = None
    """Database sessions opened while the workers ran (the harness's poller excluded)."""
    problems: list[str] = dataclasses.field(default_factory=list)

    def all_problems(self) -> list[str]:
        return [*self.drain.problems(), *self.problems]


class Reading(NamedTuple):
    """The claim counters and the database's committed transactions at one instant."""

    claims: int
    taking: int
    """Claims that took at least one job."""
    commits: int

    def __sub__(self, other: tuple[int, ...]) -> Reading:
        return Reading(*(mine - theirs for mine, theirs in zip(self, other, strict=True)))


@dataclasses.dataclass
class ClaimCount:
    """Claim statements in an idle window and in an equal window with paced enqueues."""

    workers: int
    jobs: int
    idle: Reading
    busy: Reading
    problems: list[str]

    @property
    def per_enqueue(self) -> float:
        return (self.busy.claims - self.idle.claims) / self.jobs

    @property
    def commits_per_enqueue(self) -> float:
        return (self.busy.commits - self.idle.commits) / self.jobs


@dataclasses.dataclass
class Results:
    w5: dict[tuple[str, str], Measured] = dataclasses.field(default_factory=dict)
    """(cell label, task) -> drain."""
    w5_alone: float | None = None
    """The ORM handler's body run in a loop, one thread, no queue: jobs/s."""
    w9: dict[int, Measured] = dataclasses.field(default_factory=dict)
    """Processes -> drain of a backlog that was there before they started."""
    w9_warm: dict[int, Measured] = dataclasses.field(default_factory=dict)
    """Processes -> drain of a backlog committed once they were all up and idle."""
    claims: dict[int, ClaimCount] = dataclasses.field(default_factory=dict)
    payload: dict[str, Measured] = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------- databases and producers


@contextlib.contextmanager
def scale_database(options: ScaleOptions, name: str) -> Iterator[str]:
    """A new, empty database `venturi_scale_<name>` with the schema migrated; dropped after."""
    dbname = f"{DB_PREFIX}{name}"
    with admin(options) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        migrate(options, dbname)
        yield dbname
    finally:
        with admin(options) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def produce(options: ScaleOptions, dbname: str, *args: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.scale", "produce", *args]
    return run_json(argv, child_env(options, dbname), f"producer {args[0]}")


def bulk(options: ScaleOptions, dbname: str, task: str, n: int) -> float:
    """Enqueue n jobs of `task` with one `enqueue_many` in one transaction; jobs/s."""
    result = produce(options, dbname, "bulk", "--task", task, "--n", str(n))
    return float(result["n"] / result["elapsed"])


def execute(options: ScaleOptions, dbname: str, sql: str, params: Any = None) -> None:
    with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
        conn.execute(sql, params)


def stats(options: ScaleOptions, dbname: str) -> tuple[int, int]:
    """(sessions, xact_commit) of the database once the statistics stop moving."""
    with admin(options) as conn:

        def read() -> tuple[int, int]:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(SESSIONS_READ, [dbname]).fetchone()
            return (int(row[0]), int(row[1])) if row else (0, 0)

        previous = read()
        deadline = time.monotonic() + 5.0
        while True:
            time.sleep(STATS_SETTLE)
            current = read()
            if current == previous or time.monotonic() > deadline:
                return current
            previous = current


def measured_drain(
    options: ScaleOptions,
    dbname: str,
    cell: Cell,
    name: str,
    n: int,
    timeout: float | None = None,
) -> tuple[Drain, int]:
    """harness.py's W2 drain of n jobs, and the sessions the database opened meanwhile.

    ANALYZE runs first, on a connection closed before the first reading; the drain's
    own poller, opened after it, is the one harness session subtracted.
    """
    execute(options, dbname, "ANALYZE")
    sessions_before, _ = stats(options, dbname)
    drained = drain(
        dataclasses.replace(options, n=n, analyze=False),
        dbname,
        venturi_workers(cell),
        name=name,
        unfinished_sql=VENTURI_UNFINISHED,
        done_once_sql=VENTURI_DONE_ONCE,
        # Passed, not patched: drain's default was bound when harness.py was loaded.
        timeout_s=harness.DRAIN_TIMEOUT if timeout is None else timeout,
    )
    sessions_after, _ = stats(options, dbname)
    return drained, sessions_after - sessions_before - 1


def wait_until(
    condition: Callable[[], bool], timeout: float, processes: list[subprocess.Popen[bytes]]
) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            return False
        time.sleep(SINK_POLL)
    return True
