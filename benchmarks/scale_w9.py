"""W9 of `scale.py`, scale-out: one backlog drained by 1, 2, 4 and 8 worker processes.

Cold (`run_w9`'s first half): the backlog is there before the workers start, and
their start-up is inside the window. Warm (`warm_drain`): the workers start on an
empty queue, register and go idle; then the backlog arrives in one commit and wakes
them, and the clock runs from that commit.
"""

from __future__ import annotations

import dataclasses
import time

import psycopg

from benchmarks import harness
from benchmarks.config import Cell
from benchmarks.harness import (
    VENTURI_DONE_ONCE,
    VENTURI_UNFINISHED,
    child_env,
    drain_result,
    dsn,
    follow,
    log,
    spawned,
    venturi_workers,
)
from benchmarks.results import Drain, describe
from benchmarks.scale_common import (
    DRAIN_CELL,
    Measured,
    Results,
    ScaleOptions,
    bulk,
    measured_drain,
    produce,
    scale_database,
    wait_until,
)
from benchmarks.sink import SinkReader

# ---------------------------------------------------------------- W9: scale-out


def run_w9(options: ScaleOptions, results: Results) -> None:
    for processes in options.w9_processes:
        cell = dataclasses.replace(DRAIN_CELL, processes=processes)
        with scale_database(options, f"w9_{processes}") as dbname:
            bulk(options, dbname, "sink", options.w9_n)
            drained, sessions = measured_drain(
                options, dbname, cell, f"w9_{processes}", options.w9_n
            )
        results.w9[processes] = Measured(drained, sessions=sessions)
        log(f"  W9 {cell.label()}: {describe(drained)}")
    for processes in options.w9_processes:
        cell = dataclasses.replace(DRAIN_CELL, processes=processes)
        with scale_database(options, f"w9_warm_{processes}") as dbname:
            drained, problems = warm_drain(
                options, dbname, cell, f"w9_warm_{processes}", options.w9_n
            )
        results.w9_warm[processes] = Measured(drained, problems=problems)
        log(f"  W9 warm {cell.label()}: {describe(drained)}")


WORKERS_UP = "SELECT count(*) FROM django_venturi_workerprocess WHERE stopped_at IS NULL"


def warm_drain(
    options: ScaleOptions, dbname: str, cell: Cell, name: str, n: int
) -> tuple[Drain, list[str]]:
    """W9 without start-up: the workers start and go idle on an empty queue; then n jobs
    arrive in one commit (`enqueue_many`), and wake them (NOTIFY, the wake order's
    hand-on). "all done" runs from that commit; "incl. start-up" is left out.
    """
    sink_path = options.artifact(f"{name}.sink")
    sink_path.unlink(missing_ok=True)
    reader = SinkReader(str(sink_path))
    env = child_env(options, dbname, sink_path)
    problems: list[str] = []
    with (
        psycopg.connect(dsn(options, dbname), autocommit=True) as poller,
        spawned(venturi_workers(cell), env, options.artifact(name)) as procs,
    ):
        registered = wait_until(
            lambda: poller.execute(WORKERS_UP).fetchone()[0] >= cell.processes, 60.0, procs
        )
        if not registered:
            problems.append("the workers did not all register within 60 s")
        time.sleep(options.wake_settle)
        t_commit = float(
            produce(options, dbname, "bulk", "--task", "sink", "--n", str(n))["committed"]
        )
        deadline = time.monotonic() + harness.DRAIN_TIMEOUT
        t_all_done, exits = follow(reader, n, poller, VENTURI_UNFINISHED, procs, deadline)
        reader.poll()
        (unfinished,) = poller.execute(VENTURI_UNFINISHED).fetchone()
        (done_once,) = poller.execute(VENTURI_DONE_ONCE).fetchone()
    drained = drain_result(
        reader,
        n,
        t_zero=t_commit,
        t_all_done=t_all_done,
        unfinished=unfinished,
        done_once=done_once,
        exits=exits,
    )
    return drained, problems
