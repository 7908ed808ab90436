"""The harness: databases, processes, and the drain measurement of WORKLOAD.md W2.

Fresh databases (`fresh_database`; `pgq_database` with PgQueuer's schema), the
environment of every process the suite starts (`child_env`), `manage.py migrate`,
the producers (`produce`, `pgq_produce`), the worker commands (`venturi_workers`,
`limit_workers`) and their lifetime (`spawned`, `stop`). `drain` measures one drain
of N ready jobs: `follow` watches it, `drain_result` turns it into a `Drain`. `log`
writes progress to stderr.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import peer_pgqueuer as pgq
from benchmarks.config import REPO_ROOT, SETTINGS, Cell, Options
from benchmarks.results import Drain
from benchmarks.sink import SINK_ENV, SinkReader

VENTURI_UNFINISHED = "SELECT count(*) FROM django_venturi_job WHERE state IN ('ready', 'running')"
VENTURI_DONE_ONCE = (
    "SELECT count(*) FROM django_venturi_job WHERE state = 'completed' AND attempt = 1"
)
LIMIT_DONE = "SELECT count(*) FROM peerbench_jobs WHERE status = 'done'"

DRAIN_TIMEOUT = 45.0
KILL_AFTER = 15.0
SINK_POLL = 0.005
DB_POLL = 0.010

# ---------------------------------------------------------------- databases and processes


def dsn(options: Options, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(**{**options.dsn_base, "dbname": dbname})


def admin(options: Options) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn(options, "postgres"), autocommit=True)


@contextlib.contextmanager
def fresh_database(options: Options, name: str, prefix: str = "venturi_bench_") -> Iterator[str]:
    dbname = f"{prefix}{name}"
    with admin(options) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield dbname
    finally:
        with admin(options) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def child_env(options: Options, dbname: str, sink_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["VENTURI_BENCH_DB"] = dbname
    env["VENTURI_BENCH_HOST"] = options.dsn_base["host"]
    env["VENTURI_BENCH_PORT"] = options.dsn_base["port"]
    env["VENTURI_BENCH_USER"] = options.dsn_base["user"]
    if sink_path is not None:
        env[SINK_ENV] = str(sink_path)
    if options.pgq_dsn:
        env[pgq.DSN_ENV] = options.pgq_dsn
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_json(argv: Sequence[str], env: dict[str, str], what: str) -> dict[str, Any]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def migrate(options: Options, dbname: str) -> None:
    argv = [sys.executable, "-m", "django", "migrate", "--settings", SETTINGS, "-v", "0"]
    done = subprocess.run(
        argv, env=child_env(options, dbname), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"migrate failed:\n{done.stderr[-4000:]}")


def produce(options: Options, dbname: str, mode: str, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.producer", mode, *extra]
    return run_json(argv, child_env(options, dbname), f"producer {mode}")


def analyze(options: Options, dbname: str) -> None:
    if options.analyze:
        with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
            conn.execute("ANALYZE")


def venturi_workers(cell: Cell) -> list[list[str]]:
    argv = [sys.executable, "-m", "django", "venturi_worker", "--settings", SETTINGS, *cell.flags()]
    return [argv] * cell.processes


def limit_workers(options: Options, dbname: str, mode: str, processes: int) -> list[list[str]]:
    argv = [sys.executable, "-m", "benchmarks.limit", "worker", "--mode", mode]
    return [[*argv, "--dsn", dsn(options, dbname)]] * processes


@contextlib.contextmanager
def spawned(
    commands: list[list[str]], env: dict[str, str], log_stem: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for k, argv in enumerate(commands):
            log = open(f"{log_stem}.{k}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            processes.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        yield processes
    finally:
        stop(processes)
        for log in logs:
            log.close()


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- PgQueuer's databases

PGQ_PREFIX = "peerbench_pgq_"


@contextlib.contextmanager
def pgq_database(options: Options, name: str) -> Iterator[str]:
    """A fresh database with PgQueuer's schema installed by its own tool (`pgq install`)."""
    with fresh_database(options, name, prefix=PGQ_PREFIX) as dbname:
        pgq.install(pgq_url(options, dbname), child_env(options, dbname))
        yield dbname


def pgq_url(options: Options, dbname: str) -> str:
    """asyncpg takes a postgresql:// URL, not a key=value conninfo."""
    base = options.dsn_base
    return f"postgresql://{base['user']}@{base['host']}:{base['port']}/{dbname}"


def pgq_produce(options: Options, dbname: str, mode: str, *extra: str) -> dict[str, Any]:
    argv = pgq.producer_command(mode, pgq_url(options, dbname), *extra)
    return run_json(argv, child_env(options, dbname), f"pgqueuer producer {mode}")


# ---------------------------------------------------------------- W2: drain


def drain(
    options: Options,
    dbname: str,
    commands: list[list[str]],
    *,
    name: str,
    unfinished_sql: str,
    done_once_sql: str,
    timeout_s: float = DRAIN_TIMEOUT,
) -> Drain:
    """Measure one drain of N ready jobs as WORKLOAD.md W2 says."""
    n = options.n
    analyze(options, dbname)
    sink_path = options.artifact(f"{name}.sink")
    sink_path.unlink(missing_ok=True)
    reader = SinkReader(str(sink_path))
    env = child_env(options, dbname, sink_path)
    with psycopg.connect(dsn(options, dbname), autocommit=True) as poller:
        poller.execute(unfinished_sql)  # connected and warm before the clock starts
        t_spawn = time.time()
        deadline = time.monotonic() + timeout_s
        with spawned(commands, env, options.artifact(name)) as processes:
            t_all_done, exits = follow(reader, n, poller, unfinished_sql, processes, deadline)
        reader.poll()
        (unfinished,) = poller.execute(unfinished_sql).fetchone()
        (done_once,) = poller.execute(done_once_sql).fetchone()
    return drain_result(
        reader,
        n,
        t_zero=t_spawn,
        t_all_done=t_all_done,
        unfinished=unfinished,
        done_once=done_once,
        exits=exits,
    )


def follow(
    reader: SinkReader,
    n: int,
    poller: psycopg.Connection[Any],
    unfinished_sql: str,
    processes: list[subprocess.Popen[bytes]],
    deadline: float,
) -> tuple[float | None, list[int]]:
    """Follow a drain until all n jobs were handled (the sink) and none is unfinished
    (the database): (when all were done, the return codes of workers that exited on
    their own). Neither means the deadline passed first."""
    while reader.poll() < n:
        if time.monotonic() > deadline:
            return None, []
        exits = [p.returncode for p in processes if p.poll() is not None]
        if exits:
            return None, exits
        time.sleep(SINK_POLL)
    while True:
        (unfinished,) = poller.execute(unfinished_sql).fetchone()
        if unfinished == 0:
            return time.time(), []
        if time.monotonic() > deadline:
            return None, []
        time.sleep(DB_POLL)


def drain_result(
    reader: SinkReader,
    n: int,
    *,
    t_zero: float,
    t_all_done: float | None,
    unfinished: int,
    done_once: int,
    exits: list[int],
) -> Drain:
    """The figures of a drain from its sink and the times around it. `t_zero` is when
    the clock started (the spawn; for a warm drain, the backlog's commit). A drain
    that neither finished (`t_all_done`) nor lost a worker (`exits`) timed out."""
    seconds = time.time() - t_zero
    entries = sorted(t for ts in reader.times.values() for t in ts)
    handled = len(reader.times)
    steady = startup = done = pause = flow = first_entry = None
    if entries:
        t_first, t_last = entries[0], entries[-1]
        first_entry = (t_first - t_zero) * 1000
        pause = max((b - a for a, b in itertools.pairwise(entries)), default=0.0) * 1000
        if handled > 1 and t_last > t_first:
            steady = (handled - 1) / (t_last - t_first)
        startup = handled / (t_last - t_zero)
    if t_all_done is not None and handled == n:
        done = n / (t_all_done - t_zero)
        if entries and t_all_done > entries[0]:
            flow = n / (t_all_done - entries[0])
    return Drain(
        n=n,
        handled=handled,
        steady=steady,
        startup=startup,
        done=done,
        timeout=t_all_done is None and not exits,
        duplicates=len(reader.duplicates()),
        unfinished=unfinished,
        done_once=done_once,
        malformed=reader.malformed,
        seconds=seconds,
        flow=flow,
        longest_pause=pause,
        exits=exits,
        first_entry=first_entry,
    )
