"""Issue #17's workloads: a realistic handler (W5), scale-out (W9), real payloads.

    python benchmarks/scale.py            # N = 10,000 (W9: 20,000), once (~5 min)
    python benchmarks/scale.py --quick    # smoke test: small N, < 60 s; exit 1 if a check fails
    python benchmarks/scale.py --workloads w5,claims --n 2000

W5       the no-op drain (`bench.sink`) and the ORM drain (`bench.orm`: read one `Counter`
         row, update one) at the same cell, their ratio, the database sessions opened
         during each drain (`pg_stat_database.sessions`), and the ORM handler's body
         alone in a loop (one thread, no queue).
W9       one backlog drained by 1, 2, 4 and 8 worker processes (concurrency 32, -v 0);
         then again "warm": the workers up and idle first, the backlog in one commit.
claims   claim statements per enqueue with 1 and 8 idle workers (a statement trigger counts them).
payload  W1b (`enqueue_many`) and W2 (1 process, concurrency 32, -v 0) with an int payload
         (`bench.sink`) and an eight-field one (`bench.rich`).

Every phase runs in a fresh database `venturi_scale_<phase>` (dropped at the end), set
up by `manage.py migrate`, with ANALYZE before each drain, measured by run.py's `drain`
(WORKLOAD.md W2). Prints one markdown table, writes it to benchmarks/results/scale.md
(scale_quick.md with --quick); exits 1 if a check fails. See README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import psycopg  # noqa: E402

from benchmarks import run  # noqa: E402
from benchmarks.run import DEFAULTS, Cell, Drain, fmt  # noqa: E402
from benchmarks.sink import SinkReader  # noqa: E402

WORK_DIR = run.RESULTS_DIR / "scale_run"
DB_PREFIX = "venturi_scale_"
WORKLOADS = ("w5", "w9", "claims", "payload")
TASKS = {"sink": "bench.sink", "orm": "bench.orm", "rich": "bench.rich"}

DRAIN_CELL = Cell(1, 32, None, 0)
"""One process, concurrency 32, -v 0: W5's first cell, the payload drains, W9's unit."""
W5_CELLS = (DRAIN_CELL, DEFAULTS)
W5_RATIO_TARGET = 0.60
"""W5: the ORM drain at no less than 60 % of the no-op drain's rate."""
W5_DRAIN_TIMEOUT = 300.0
"""W5's drains may take longer than WORKLOAD.md's 45 s: a handler that opens a new
database connection per job runs at a few hundred jobs/s here."""
W9_PROCESSES = (1, 2, 4, 8)
W9_RATIO_TARGET = 0.80
"""W9: 8 processes at no less than 80 % of the best process count."""
CLAIM_WORKERS = (1, 8)
CLAIMS_TARGET = 2.0
"""Claim statements per enqueue with eight idle workers: at most 2."""
PROBE_I = 90_000_000
PRODUCER_MARGIN = 4.0
"""Seconds from spawning the paced producer to the idle window's start: its set-up."""
STATS_SETTLE = 0.6
"""The cumulative statistics of a backend that went idle or exited reach the view
within about a second; read, wait this long, read again until two reads agree."""

# Counts every claim statement: an AFTER ... FOR EACH STATEMENT trigger fires once per
# UPDATE statement, even one that updates no row (an empty claim), and
# current_query() is the text the client sent. Only the claim is an UPDATE of the job
# table that says both `SET state = 'running'` and `FOR UPDATE SKIP LOCKED` (the
# lease rescuer locks with `FOR NO KEY UPDATE OF job SKIP LOCKED`). Sequences, not a
# table, keep count: nextval() writes no row and is seen at once, outside transactions.
# The second counts the claims that took at least one job (the transition table holds
# the rows the statement updated): with one job per enqueue, 200 ms apart, it must
# equal the number of enqueues, which validates the count.
CLAIM_COUNTER_SQL = """
CREATE SEQUENCE venturi_scale_claims;
CREATE SEQUENCE venturi_scale_claims_taking;
CREATE FUNCTION venturi_scale_count_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_query() LIKE '%SET state = ''running''%'
       AND current_query() LIKE '%FOR UPDATE SKIP LOCKED%' THEN
        PERFORM nextval('venturi_scale_claims');
        IF EXISTS (SELECT 1 FROM claimed) THEN
            PERFORM nextval('venturi_scale_claims_taking');
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER venturi_scale_count_claim AFTER UPDATE ON django_venturi_job
    REFERENCING NEW TABLE AS claimed
    FOR EACH STATEMENT EXECUTE FUNCTION venturi_scale_count_claim();
"""
CLAIMS_READ = """
SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM venturi_scale_claims),
       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM venturi_scale_claims_taking),
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
"""
SESSIONS_READ = "SELECT sessions, xact_commit FROM pg_stat_database WHERE datname = %s"
COUNTER_SEED = (
    "INSERT INTO benchapp_counter (id, value, touched_at) "
    "SELECT g, 0, NULL FROM generate_series(1, %s) AS g"
)
COUNTER_CHECK = "SELECT coalesce(sum(value), 0), count(touched_at) FROM benchapp_counter"


@dataclasses.dataclass
class ScaleOptions(run.Options):
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
    with run.admin(options) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        run.migrate(options, dbname)
        yield dbname
    finally:
        with run.admin(options) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def produce(options: ScaleOptions, dbname: str, *args: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.scale", "produce", *args]
    return run.run_json(argv, run.child_env(options, dbname), f"producer {args[0]}")


def bulk(options: ScaleOptions, dbname: str, task: str, n: int) -> float:
    """Enqueue n jobs of `task` with one `enqueue_many` in one transaction; jobs/s."""
    result = produce(options, dbname, "bulk", "--task", task, "--n", str(n))
    return float(result["n"] / result["elapsed"])


def execute(options: ScaleOptions, dbname: str, sql: str, params: Any = None) -> None:
    with psycopg.connect(run.dsn(options, dbname), autocommit=True) as conn:
        conn.execute(sql, params)


def stats(options: ScaleOptions, dbname: str) -> tuple[int, int]:
    """(sessions, xact_commit) of the database once the statistics stop moving."""
    with run.admin(options) as conn:

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


@contextlib.contextmanager
def drain_timeout(seconds: float | None) -> Iterator[None]:
    """Raise run.drain's timeout (run.DRAIN_TIMEOUT, a module constant) for one drain."""
    saved = run.DRAIN_TIMEOUT
    run.DRAIN_TIMEOUT = saved if seconds is None else seconds
    try:
        yield
    finally:
        run.DRAIN_TIMEOUT = saved


def measured_drain(
    options: ScaleOptions,
    dbname: str,
    cell: Cell,
    name: str,
    n: int,
    timeout: float | None = None,
) -> tuple[Drain, int]:
    """run.py's W2 drain of n jobs, and the sessions the database opened meanwhile.

    ANALYZE runs first, on a connection closed before the first reading; the drain's
    own poller, opened after it, is the one harness session subtracted.
    """
    execute(options, dbname, "ANALYZE")
    sessions_before, _ = stats(options, dbname)
    with drain_timeout(timeout):
        drained = run.drain(
            dataclasses.replace(options, n=n, analyze=False),
            dbname,
            run.venturi_workers(cell),
            name=name,
            unfinished_sql=run.VENTURI_UNFINISHED,
            done_once_sql=run.VENTURI_DONE_ONCE,
        )
    sessions_after, _ = stats(options, dbname)
    return drained, sessions_after - sessions_before - 1


# ---------------------------------------------------------------- W5: a realistic handler


def run_w5(options: ScaleOptions, results: Results) -> None:
    with scale_database(options, "w5_alone") as dbname:
        execute(options, dbname, COUNTER_SEED, [options.counter_rows])
        alone = produce(options, dbname, "alone", "--task", "orm", "--n", str(options.n))
        results.w5_alone = alone["n"] / alone["elapsed"]
        run.log(f"  W5 ORM handler alone: {results.w5_alone:,.0f} jobs/s")
    for cell in options.w5_cells:
        tag = f"{cell.processes}x{cell.concurrency or 'default'}"
        for task in ("sink", "orm"):
            with scale_database(options, f"w5_{tag}_{task}") as dbname:
                if task == "orm":
                    execute(options, dbname, COUNTER_SEED, [options.counter_rows])
                bulk(options, dbname, task, options.n)
                drained, sessions = measured_drain(
                    options, dbname, cell, f"w5_{tag}_{task}", options.n, W5_DRAIN_TIMEOUT
                )
                result = Measured(drained, sessions=sessions)
                if task == "orm":
                    result.problems += counter_problems(options, dbname, options.n)
            results.w5[(cell.label(), task)] = result
            run.log(f"  W5 {task} {cell.label()}: {run.describe(drained)}, {sessions} sessions")


def counter_problems(options: ScaleOptions, dbname: str, n: int) -> list[str]:
    """Every ORM job's update landed once: the counters add up to n."""
    with psycopg.connect(run.dsn(options, dbname), autocommit=True) as conn:
        total, touched = conn.execute(COUNTER_CHECK).fetchone()
    expected_touched = min(n, options.counter_rows)
    found = []
    if total != n:
        found.append(f"counters add up to {total:,}, expected {n:,}")
    if touched != expected_touched:
        found.append(f"{touched:,} counters touched, expected {expected_touched:,}")
    return found


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
        run.log(f"  W9 {cell.label()}: {run.describe(drained)}")
    for processes in options.w9_processes:
        cell = dataclasses.replace(DRAIN_CELL, processes=processes)
        with scale_database(options, f"w9_warm_{processes}") as dbname:
            drained, problems = warm_drain(
                options, dbname, cell, f"w9_warm_{processes}", options.w9_n
            )
        results.w9_warm[processes] = Measured(drained, problems=problems)
        run.log(f"  W9 warm {cell.label()}: {run.describe(drained)}")


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
    env = run.child_env(options, dbname, sink_path)
    problems: list[str] = []
    with (
        psycopg.connect(run.dsn(options, dbname), autocommit=True) as poller,
        run.spawned(run.venturi_workers(cell), env, options.artifact(name)) as procs,
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
        deadline = time.monotonic() + run.DRAIN_TIMEOUT
        t_all_done, exits = run.follow(reader, n, poller, run.VENTURI_UNFINISHED, procs, deadline)
        reader.poll()
        (unfinished,) = poller.execute(run.VENTURI_UNFINISHED).fetchone()
        (done_once,) = poller.execute(run.VENTURI_DONE_ONCE).fetchone()
    drained = run.drain_result(
        reader,
        n,
        t_zero=t_commit,
        t_all_done=t_all_done,
        unfinished=unfinished,
        done_once=done_once,
        exits=exits,
    )
    return drained, problems


def run_claims(options: ScaleOptions, results: Results) -> None:
    """Claim statements per enqueue: idle window, then an equal window of paced enqueues."""
    for workers in CLAIM_WORKERS:
        with scale_database(options, f"claims_{workers}") as dbname:
            execute(options, dbname, CLAIM_COUNTER_SQL)
            results.claims[workers] = count_claims(options, dbname, workers)
        run.log(f"  claims, {workers} idle worker(s): {describe_claims(results.claims[workers])}")


def count_claims(options: ScaleOptions, dbname: str, workers: int) -> ClaimCount:
    """Start the workers, handle a probe, wait; then window A-B idle, B-C paced enqueues."""
    sink_path = options.artifact(f"claims_{workers}.sink")
    sink_path.unlink(missing_ok=True)
    reader = SinkReader(str(sink_path))
    env = run.child_env(options, dbname, sink_path)
    cell = dataclasses.replace(DRAIN_CELL, processes=workers)
    problems: list[str] = []
    with (
        psycopg.connect(run.dsn(options, dbname), autocommit=True) as conn,
        run.spawned(run.venturi_workers(cell), env, options.artifact(f"claims_{workers}")) as procs,
    ):
        produce(options, dbname, "one", "--i", str(PROBE_I))
        if not wait_until(lambda: reader.poll() >= 1, 30.0, procs):
            problems.append("the probe job was not handled within 30 s")
        time.sleep(options.wake_settle)
        readings, producer_problems = paced_windows(options, conn, env)
        problems += producer_problems
        handled = reader.poll() - 1
        exits = [p.returncode for p in procs if p.poll() is not None]
        if exits:
            problems.append(f"worker exited early (codes {exits})")
        (unfinished,) = conn.execute(run.VENTURI_UNFINISHED).fetchone()
    idle, busy = readings[1] - readings[0], readings[2] - readings[1]
    if handled != options.claim_jobs:
        problems.append(f"{handled}/{options.claim_jobs} paced jobs handled within the window")
    if reader.duplicates():
        problems.append(f"{len(reader.duplicates())} i handled twice")
    if unfinished:
        problems.append(f"{unfinished} jobs unfinished")
    if busy.taking != options.claim_jobs:
        problems.append(
            f"count not validated: {busy.taking} claims took a job, expected one per enqueue "
            f"({options.claim_jobs}); does the trigger's match still fit the claim's SQL?"
        )
    return ClaimCount(workers, options.claim_jobs, idle, busy, problems)


def paced_windows(
    options: ScaleOptions, conn: psycopg.Connection[Any], env: dict[str, str]
) -> tuple[list[Reading], list[str]]:
    """Readings at A, B = A + window, C = B + window; the producer enqueues from B on.

    The producer is spawned PRODUCER_MARGIN seconds before A, so its start-up (Django
    set-up, connecting) falls in neither window.
    """
    window = options.claim_window
    start = time.time() + PRODUCER_MARGIN + window
    argv = [sys.executable, "-m", "benchmarks.scale", "produce", "paced"]
    argv += ["--n", str(options.claim_jobs), "--interval", str(options.claim_interval)]
    argv += ["--start", repr(start)]
    readings: list[Reading] = []
    problems: list[str] = []
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as producer:
        for at in (start - window, start, start + window):
            time.sleep(max(0.0, at - time.time()))
            conn.execute("SELECT pg_stat_clear_snapshot()")
            readings.append(Reading(*conn.execute(CLAIMS_READ).fetchone()))
        out, _ = producer.communicate(timeout=60)
    if producer.returncode != 0:
        problems.append(f"paced producer failed ({producer.returncode})")
    elif (late := json.loads(out)["ready"] - (start - window)) > 0:
        problems.append(f"producer set up {late:.2f} s into the idle window")
    return readings, problems


def wait_until(
    condition: Callable[[], bool], timeout: float, processes: list[subprocess.Popen[bytes]]
) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            return False
        time.sleep(run.SINK_POLL)
    return True


def describe_claims(result: ClaimCount) -> str:
    problems = "; ".join(result.problems)
    return (
        f"{result.per_enqueue:.2f} claims per enqueue ({result.busy.claims} with "
        f"{result.jobs} enqueues, {result.busy.taking} of them took a job; "
        f"{result.idle.claims} idle), "
        f"{result.commits_per_enqueue:.1f} transactions per enqueue"
    ) + (f" [{problems}]" if problems else "")


# ---------------------------------------------------------------- real payloads


def run_payload(options: ScaleOptions, results: Results) -> None:
    for task in ("sink", "rich"):
        with scale_database(options, f"payload_{task}") as dbname:
            rate = bulk(options, dbname, task, options.n)
            drained, sessions = measured_drain(
                options, dbname, DRAIN_CELL, f"payload_{task}", options.n
            )
        results.payload[task] = Measured(drained, enqueue_rate=rate, sessions=sessions)
        run.log(f"  payload {task}: enqueue_many {rate:,.0f} jobs/s; {run.describe(drained)}")


# ---------------------------------------------------------------- the table


HEADER = ["workload", "configuration", "metric", "figure", "ratio", "target", "checks / notes"]
METRICS = (("steady", "steady"), ("startup", "incl. start-up"), ("done", "all done in DB"))


def note(result: Measured) -> str:
    problems = result.all_problems()
    text = "; ".join(problems) if problems else "ok: each i once, 0 unfinished"
    pause = result.drain.longest_pause
    return text + (f"; longest pause {fmt(pause)} ms" if pause is not None else "")


def ratio_of(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def alone_share(value: float | None, results: Results) -> str:
    share = ratio_of(value, results.w5_alone)
    return "" if share is None else f"{share * 100:.0f} % of the handler alone"


def verdict(value: float | None, target: float, *, at_most: bool = False) -> str:
    if value is None:
        return run.MISSING
    met = value <= target if at_most else value >= target
    return "met" if met else "missed"


def w5_rows(options: ScaleOptions, results: Results) -> list[list[str]]:
    rows = []
    if results.w5_alone is not None:
        rows.append(
            [
                "W5 ORM handler alone",
                "1 thread, no queue",
                "all done",
                f"{fmt(results.w5_alone)} jobs/s",
                "",
                "",
                "its `handle` called in a loop: one interpreter's ceiling for this handler",
            ]
        )
    for cell in options.w5_cells:
        noop = results.w5.get((cell.label(), "sink"))
        orm = results.w5.get((cell.label(), "orm"))
        if noop is None or orm is None:
            continue
        for metric, label in METRICS:
            base, value = getattr(noop.drain, metric), getattr(orm.drain, metric)
            share = ratio_of(value, base)
            target = f"ORM ≥ 60 %: {verdict(share, W5_RATIO_TARGET)}"
            rows.append(
                ["W5 no-op", cell.label(), label, f"{fmt(base)} jobs/s", "", "", note(noop)]
            )
            rows.append(
                [
                    "W5 ORM",
                    cell.label(),
                    label,
                    f"{fmt(value)} jobs/s",
                    f"{fmt(None if share is None else share * 100)} % of no-op",
                    target,
                    "; ".join(filter(None, [alone_share(value, results), note(orm)])),
                ]
            )
        limit = 2 * (cell.concurrency or 10) * cell.processes
        for task, result in (("no-op", noop), ("ORM", orm)):
            rows.append(
                [
                    f"W5 {task}",
                    cell.label(),
                    f"sessions opened during the {options.n:,}-job drain",
                    fmt(result.sessions),
                    "",
                    f"≤ {limit}: {verdict(result.sessions, limit, at_most=True)}",
                    "pg_stat_database.sessions after stop minus before spawn, "
                    "the harness's poller excluded",
                ]
            )
    return rows


def w9_rows(options: ScaleOptions, results: Results) -> list[list[str]]:
    cold = scale_rows(f"W9 ({options.w9_n:,} jobs)", results.w9, METRICS)
    warm_metrics = (("steady", "steady"), ("done", "commit to all done in DB"))
    warm = scale_rows(f"W9 warm ({options.w9_n:,} jobs)", results.w9_warm, warm_metrics)
    return cold + warm


def scale_rows(
    workload: str, drains: dict[int, Measured], metrics: tuple[tuple[str, str], ...]
) -> list[list[str]]:
    rows: list[list[str]] = []
    if not drains:
        return rows
    largest = max(drains)
    for metric, label in metrics:
        best = max((getattr(r.drain, metric) or 0.0 for r in drains.values()), default=0.0)
        for processes, result in sorted(drains.items()):
            value = getattr(result.drain, metric)
            cell = dataclasses.replace(DRAIN_CELL, processes=processes)
            share = ratio_of(value, best)
            target = ""
            if processes == largest and metric != "startup":
                target = f"{largest} processes ≥ 80 % of best: {verdict(share, W9_RATIO_TARGET)}"
            rows.append(
                [
                    workload,
                    cell.label(),
                    label,
                    f"{fmt(value)} jobs/s",
                    f"{fmt(None if share is None else share * 100)} % of best",
                    target,
                    note(result)
                    + ("" if result.sessions is None else f"; {fmt(result.sessions)} sessions"),
                ]
            )
    return rows


def claim_rows(options: ScaleOptions, results: Results) -> list[list[str]]:
    rows = []
    for workers, result in sorted(results.claims.items()):
        cell = dataclasses.replace(DRAIN_CELL, processes=workers)
        problems = (
            "; ".join(result.problems)
            if result.problems
            else f"ok: each i once, 0 unfinished, count validated ({result.busy.taking} claims "
            f"took a job = {result.jobs} enqueues)"
        )
        detail = (
            f"{problems}; {result.busy.claims} claims in "
            f"{options.claim_window:.1f} s with "
            f"{result.jobs} enqueues {options.claim_interval * 1000:.0f} ms apart, "
            f"{result.idle.claims} in an idle {options.claim_window:.1f} s; "
            f"{result.commits_per_enqueue:.1f} transactions committed per enqueue "
            "(xact_commit, idle subtracted, the enqueue's own included)"
        )
        target = (
            f"≤ 2 with 8 workers: {verdict(result.per_enqueue, CLAIMS_TARGET, at_most=True)}"
            if workers == 8
            else "— (one worker: the floor)"
        )
        rows.append(
            [
                "W9 claims",
                cell.label() + ", idle",
                "claim statements per enqueue",
                f"{result.per_enqueue:.2f}",
                "",
                target,
                detail,
            ]
        )
    return rows


def payload_rows(results: Results) -> list[list[str]]:
    rows = []
    base = results.payload.get("sink")
    for task, result in results.payload.items():
        label = "int (`bench.sink`)" if task == "sink" else "8 fields (`bench.rich`)"
        values = [
            ("W1b", "enqueue_many, 1 transaction", result.enqueue_rate, base and base.enqueue_rate)
        ]
        values += [
            (
                "W2",
                f"{DRAIN_CELL.label()}: {text}",
                getattr(result.drain, metric),
                base and getattr(base.drain, metric),
            )
            for metric, text in METRICS
            if metric != "startup"
        ]
        for workload, metric, value, reference in values:
            share = ratio_of(value, reference)
            rows.append(
                [
                    f"{workload} payload",
                    label,
                    metric,
                    f"{fmt(value)} jobs/s",
                    f"{fmt(None if share is None else share * 100)} % of int",
                    "",
                    note(result) if workload == "W2" else "",
                ]
            )
    return rows


def build_table(options: ScaleOptions, results: Results) -> tuple[str, list[str]]:
    failures = [
        f"W5 {task} {label}: {p}"
        for (label, task), r in results.w5.items()
        for p in r.all_problems()
    ]
    failures += [f"W9 {k} processes: {p}" for k, r in results.w9.items() for p in r.all_problems()]
    failures += [
        f"W9 warm {k} processes: {p}" for k, r in results.w9_warm.items() for p in r.all_problems()
    ]
    failures += [f"claims {k} workers: {p}" for k, r in results.claims.items() for p in r.problems]
    failures += [f"payload {k}: {p}" for k, r in results.payload.items() for p in r.all_problems()]
    rows = w5_rows(options, results) + w9_rows(options, results)
    rows += claim_rows(options, results) + payload_rows(results)
    lines = ["| " + " | ".join(HEADER) + " |", "|---|---|---|---:|---:|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    title = (
        f"django-venturi scale workloads (issue #17), N = {options.n:,}, W9 N = "
        f"{options.w9_n:,}{' (quick)' if options.quick else ''}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    return f"### {title}\n\n{run.code_version()}\n\n" + "\n".join(lines) + "\n", failures


# ---------------------------------------------------------------- the producer side


def producer_main(argv: list[str]) -> int:
    """`python -m benchmarks.scale produce MODE ...`: Django set up, prints one JSON object."""
    parser = argparse.ArgumentParser(prog="benchmarks.scale produce")
    parser.add_argument("mode", choices=["bulk", "one", "paced", "alone"])
    parser.add_argument("--task", choices=sorted(TASKS), default="sink")
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--i", type=int, default=0)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--start", type=float, default=0.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", run.SETTINGS)
    import django
    from django.db import connection

    django.setup()
    connection.ensure_connection()
    if args.mode == "bulk":
        result = produce_bulk(args.task, args.n)
    elif args.mode == "alone":
        result = run_alone(args.task, args.n)
    elif args.mode == "one":
        make_job("sink")(args.i).enqueue()
        result = {"n": 1}
    else:
        result = produce_paced(args.n, args.interval, args.start)
    json.dump(result, sys.stdout)
    return 0


def make_job(task: str) -> Callable[[int], Any]:
    from benchmarks.bench_project.benchapp import tasks

    factories: dict[str, Callable[[int], Any]] = {
        "sink": lambda i: tasks.SinkJob(i=i),
        "orm": lambda i: tasks.OrmJob(i=i),
        "rich": tasks.RichJob.example,
    }
    return factories[task]


def produce_bulk(task: str, n: int) -> dict[str, Any]:
    """One `enqueue_many` inside `transaction.atomic()`, building the list included."""
    from django.db import transaction

    import django_venturi as venturi

    factory = make_job(task)
    start = time.perf_counter()
    with transaction.atomic():
        jobs = venturi.enqueue_many([factory(i) for i in range(n)])
    committed = time.time()
    elapsed = time.perf_counter() - start
    assert len(jobs) == n
    return {"n": n, "elapsed": elapsed, "committed": committed}


def run_alone(task: str, n: int) -> dict[str, Any]:
    """The handlers of n jobs of `task` called in a loop, one thread, no queue at all:
    what one interpreter does with that handler alone (W5's ceiling)."""
    import tempfile

    factory = make_job(task)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["VENTURI_BENCH_SINK"] = os.path.join(scratch, "sink")
        jobs = [factory(i) for i in range(n)]
        start = time.perf_counter()
        for job in jobs:
            job.handle(None)
        elapsed = time.perf_counter() - start
    return {"n": n, "elapsed": elapsed}


def produce_paced(n: int, interval: float, start: float) -> dict[str, Any]:
    """Job i enqueued at start + i x interval (absolute schedule), each its own transaction."""
    from django.db import connection

    assert connection.get_autocommit()
    factory = make_job("sink")
    ready = time.time()
    for i in range(n):
        time.sleep(max(0.0, start + i * interval - time.time()))
        factory(i).enqueue()
    return {"n": n, "ready": ready}


# ---------------------------------------------------------------- main


def parse(argv: list[str] | None) -> ScaleOptions:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: small N, < 60 s")
    parser.add_argument("--n", type=int, default=None, help="jobs of W5 and payload (10,000)")
    parser.add_argument("--w9-n", type=int, default=None, help="jobs of each W9 drain (20,000)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=",".join(WORKLOADS))
    parser.add_argument("--host", default=os.environ.get("VENTURI_BENCH_HOST", "127.0.0.1"))
    parser.add_argument("--port", default=os.environ.get("VENTURI_BENCH_PORT", "5432"))
    parser.add_argument("--user", default=os.environ.get("VENTURI_BENCH_USER", "postgres"))
    args = parser.parse_args(argv)
    workloads = {w.strip().lower() for w in args.workloads.split(",") if w.strip()}
    if workloads - set(WORKLOADS):
        parser.error(f"unknown workloads: {', '.join(sorted(workloads - set(WORKLOADS)))}")
    quick = args.quick
    return ScaleOptions(
        n=args.n or (200 if quick else 10_000),
        repeat=1,
        grid=[],
        wake_count=0,
        wake_settle=0.5 if quick else 1.0,
        analyze=True,
        workloads=workloads,
        dsn_base={"host": args.host, "port": str(args.port), "user": args.user},
        quick=quick,
        output=run.RESULTS_DIR / ("scale_quick.md" if quick else "scale.md"),
        w9_n=args.w9_n or (400 if quick else 20_000),
        w9_processes=(1, 8) if quick else W9_PROCESSES,
        w5_cells=(DRAIN_CELL,) if quick else W5_CELLS,
        claim_jobs=5 if quick else 20,
        claim_tail=1.0,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = Results()
    phases = (("w5", run_w5), ("w9", run_w9), ("claims", run_claims), ("payload", run_payload))
    for name, phase in phases:
        if name in options.workloads:
            run.log(f"{name}:")
            phase(options, results)
    table, failures = build_table(options, results)
    footer = f"\nTotal time {time.monotonic() - started:.0f} s. " + (
        "All checks passed."
        if not failures
        else "FAILED CHECKS:\n" + "\n".join(f"- {failure}" for failure in failures)
    )
    print(table + footer)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(table + footer + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        raise SystemExit(producer_main(sys.argv[2:]))
    raise SystemExit(main())
