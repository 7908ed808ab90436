"""django-venturi benchmark suite: WORKLOAD.md's W1, W1b, W2a, W2b, W3, the W4 limit, and W7.

    python benchmarks/run.py            # full run (N=10,000, three alternating rounds)
    python benchmarks/run.py --quick    # CI smoke test (N=100, once): exits 1 if a check fails
    python benchmarks/run.py --n 2000 --repeat 1 --workloads w1,w2a

Every phase runs in a freshly created database (dropped at the end) whose schema
`manage.py migrate` installs (the W4 limit: its one CREATE TABLE). Prints one
markdown table and writes it to benchmarks/results/latest.md; see README.md.
W7 (dedup under contention) is this suite's own: 8 producers enqueue keyed jobs at once.
The PgQueuer peer (benchmarks/peer_pgqueuer.py) runs the same workloads in the same
rounds as venturi and W4, in alternating order; `--no-peers` leaves it out.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import psycopg  # noqa: E402

from benchmarks import chart, compare, limit  # noqa: E402
from benchmarks import peer_pgqueuer as pgq  # noqa: E402
from benchmarks.sink import SINK_ENV, SinkReader  # noqa: E402

SETTINGS = "benchmarks.bench_project.settings"
RESULTS_DIR = BENCH_DIR / "results"
WORK_DIR = RESULTS_DIR / "run"
VENTURI_UNFINISHED = "SELECT count(*) FROM django_venturi_job WHERE state IN ('ready', 'running')"
VENTURI_DONE_ONCE = (
    "SELECT count(*) FROM django_venturi_job WHERE state = 'completed' AND attempt = 1"
)
LIMIT_DONE = "SELECT count(*) FROM peerbench_jobs WHERE status = 'done'"

MISSING = "n/a"
DRAIN_TIMEOUT = 45.0
KILL_AFTER = 15.0
SINK_POLL = 0.005
DB_POLL = 0.010


# ---------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class Cell:
    """One venturi worker configuration: processes x `venturi_worker` flags."""

    processes: int
    concurrency: int | None = None
    batch_size: int | None = None
    verbosity: int | None = None

    def flags(self) -> list[str]:
        flags: list[str] = []
        if self.concurrency is not None:
            flags += ["--concurrency", str(self.concurrency)]
        if self.batch_size is not None:
            flags += ["--batch-size", str(self.batch_size)]
        if self.verbosity is not None:
            flags += ["--verbosity", str(self.verbosity)]
        return flags

    def label(self) -> str:
        if self == DEFAULTS:
            return "1 process, defaults (concurrency 10, batch 500, -v 1)"
        parts = [f"{self.processes} process{'es' if self.processes > 1 else ''}"]
        parts.append(f"concurrency {self.concurrency or 10}")
        parts.append(f"batch {self.batch_size or 500}")
        parts.append(f"-v {1 if self.verbosity is None else self.verbosity}")
        return ", ".join(parts)


DEFAULTS = Cell(processes=1)

# A claim takes min(free handler slots, batch size) jobs, so the batch size only
# matters when it is below the concurrency: the grid varies the concurrency, with
# the batch size at its default or raised to match it. -v 0 logs warnings only;
# one cell keeps the default -v 1 (an INFO line per job) to show what that costs.
FULL_GRID = [
    Cell(1, 10, 100, 0),
    Cell(1, 32, 100, 0),
    Cell(1, 128, 100, 0),
    Cell(1, 500, 500, 0),
    Cell(2, 10, 100, 0),
    Cell(2, 32, 100, 0),
    Cell(2, 128, 100, 0),
    Cell(2, 500, 500, 0),
    Cell(4, 128, 100, 0),
    Cell(1, 128, 100, None),
]
# The default grid: the cells that matter beside the PgQueuer peer (`--cells full`: all).
GRID = [
    Cell(1, 16, 500, 0),
    Cell(2, 8, 500, 0),
    Cell(2, 8, 1000, 0),
    Cell(1, 16, 500, None),
]
QUICK_GRID = [Cell(1, 32, 100, 0), Cell(2, 32, 100, 0)]
W2C_CELL = Cell(2, 8, 1000, 0)
"""W2c's venturi configuration when no W2b cell of at most 2 processes ran."""
W2C_N = 100_000
QUICK_W2C_N = 1_000
PEERS = ("pgqueuer",)

LIMIT_DRAINS = [("claim1", 1), ("batch100", 1), ("batch100", 2)]

WORKLOADS = ("w4", "w1", "w2a", "w1b", "w2b", "w2c", "w3", "w6", "w7", "w8")

# W6: claim-and-complete TARGET jobs beside a large table of jobs the worker does
# not take: ready jobs due tomorrow (same kind, queue, tier and rank, so they sit in
# the very range of the claim index the claim walks, past the due ones), or
# finished jobs (outside the partial index altogether).
W6_TARGET = 5_000
W6_CASES = (
    ("ready_10k", "ready", 10_000),
    ("ready_1m", "ready", 1_000_000),
    ("finished_1m", "finished", 1_000_000),
)
QUICK_W6_TARGET = 100
QUICK_W6_CASES = (
    ("ready_10k", "ready", 1_000),
    ("ready_1m", "ready", 10_000),
    ("finished_1m", "finished", 10_000),
)
W6_CELL = Cell(1, 32, 100, 0)
"""W6 and W8 run one worker process at concurrency 32 without the per-job log line."""

# W8: worker RSS after a warm-up, then every W8_STEP jobs up to W8_JOBS more.
W8_WARMUP = 1_000
W8_JOBS = 100_000
W8_STEP = 10_000
QUICK_W8 = (100, 1_000, 250)
W8_TIMEOUT = 300.0

# W7: producers x enqueues each over DEDUP_KEYS keys (key = i % DEDUP_KEYS).
DEDUP_PRODUCERS = 8
DEDUP_PER_PRODUCER = 250
QUICK_DEDUP_PER_PRODUCER = 13
DEDUP_KEYS = 10
DEDUP_TIMEOUT = 300.0


def dedup_margin(producers: int) -> float:
    """Seconds from spawning the W7 producers to their common start: time to set up Django."""
    return 2.0 + 0.75 * producers


@dataclasses.dataclass
class Options:
    n: int
    repeat: int
    grid: list[Cell]
    wake_count: int
    wake_settle: float
    analyze: bool
    workloads: set[str]
    dsn_base: dict[str, str]
    quick: bool
    output: Path
    dedup_per_producer: int = DEDUP_PER_PRODUCER
    w6_target: int = W6_TARGET
    w6_cases: tuple[tuple[str, str, int], ...] = W6_CASES
    w8: tuple[int, int, int] = (W8_WARMUP, W8_JOBS, W8_STEP)
    """Warm-up jobs, measured jobs, jobs between RSS samples."""
    chart: Path | None = None
    peers: set[str] = dataclasses.field(default_factory=set)
    """Peer libraries run beside venturi (`pgqueuer`), once found importable."""
    pgq_grid: list[pgq.PgqCell] = dataclasses.field(default_factory=list)
    w2c_n: int = W2C_N
    pgq_dsn: str = ""
    """The database PgQueuer's workers connect to (`child_env` passes it on)."""
    run: int = 0
    """The repetition being run (0-based): names the log and sink files."""

    def artifact(self, name: str) -> Path:
        return WORK_DIR / f"run{self.run + 1}_{name}"


# ---------------------------------------------------------------- results


@dataclasses.dataclass
class Drain:
    n: int
    handled: int
    steady: float | None
    startup: float | None
    done: float | None
    timeout: bool
    duplicates: int
    unfinished: int
    done_once: int
    malformed: int
    seconds: float
    flow: float | None
    """N / (t_all_done - t_first): the claim-and-complete rate without start-up (W6)."""
    longest_pause: float | None
    """The longest gap between consecutive handler entries, in ms: a stall detector."""
    exits: list[int]
    first_entry: float | None = None
    """From t_spawn to the first handler entry, in ms: start-up."""
    """Return codes of worker processes that exited before they were stopped."""

    def problems(self) -> list[str]:
        found = []
        if self.exits:
            found.append(f"worker exited early (codes {self.exits})")
        if self.timeout:
            found.append(f"timeout, {self.handled}/{self.n} handled")
        elif self.handled != self.n:
            found.append(f"{self.handled}/{self.n} handled")
        if self.duplicates:
            found.append(f"{self.duplicates} i handled twice")
        if self.unfinished:
            found.append(f"{self.unfinished} jobs unfinished")
        if self.done_once != self.n:
            found.append(f"{self.done_once}/{self.n} finished after exactly one run")
        if self.malformed:
            found.append(f"{self.malformed} malformed sink lines")
        return found


@dataclasses.dataclass
class Wake:
    count: int
    received: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    duplicates: int
    error: str = ""
    latencies: list[float] = dataclasses.field(default_factory=list)
    """Every latency received, in ms (for the chart)."""

    def problems(self) -> list[str]:
        found = []
        if self.error:
            found.append(self.error)
        if self.received != self.count:
            found.append(f"{self.received}/{self.count} received")
        if self.duplicates:
            found.append(f"{self.duplicates} i handled twice")
        return found


@dataclasses.dataclass
class Dedup:
    """W7: concurrent keyed enqueues, and what the database holds afterwards."""

    producers: int
    per_producer: int
    keys: int
    elapsed: float | None
    """From the common start to the end of the last producer, in s."""
    rate: float | None
    live: int
    count_sum: int
    merged: int
    rows: int
    late: list[float]
    """Seconds by which producers were set up only after the common start."""
    slack: float | None
    """The shortest wait of a producer at the start barrier, in s."""
    errors: list[str]

    @property
    def total(self) -> int:
        return self.producers * self.per_producer

    def problems(self) -> list[str]:
        found = list(self.errors)
        if self.late:
            lates = ", ".join(f"{t:.2f}" for t in self.late)
            found.append(f"{len(self.late)} producer(s) ready after the start barrier (+{lates} s)")
        if self.live != self.keys:
            found.append(f"{self.live} live jobs, expected {self.keys}")
        if self.count_sum != self.total:
            found.append(f"sum of count {self.count_sum:,}, expected {self.total:,}")
        return found


@dataclasses.dataclass
class Record:
    """Every measurement of one repetition, keyed by a short name."""

    enqueue: dict[str, float] = dataclasses.field(default_factory=dict)
    drains: dict[str, Drain] = dataclasses.field(default_factory=dict)
    wakes: dict[str, Wake] = dataclasses.field(default_factory=dict)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)
    dedup: Dedup | None = None
    memory: Memory | None = None


@dataclasses.dataclass
class Memory:
    """W8: the worker's resident set size, sampled as it works through many jobs."""

    warmup: int
    jobs: int
    samples: list[tuple[int, int]]
    """(jobs handled since the warm-up, VmRSS in kB), the first one after the warm-up."""
    handled: int
    duplicates: int
    unfinished: int
    seconds: float
    error: str = ""

    @property
    def growth_mb(self) -> float | None:
        if len(self.samples) < 2:
            return None
        return (self.samples[-1][1] - self.samples[0][1]) / 1024

    def problems(self) -> list[str]:
        found = [self.error] if self.error else []
        if self.handled != self.warmup + self.jobs:
            found.append(f"{self.handled:,}/{self.warmup + self.jobs:,} handled")
        if self.duplicates:
            found.append(f"{self.duplicates} i handled twice")
        if self.unfinished:
            found.append(f"{self.unfinished} jobs unfinished")
        return found


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


# ---------------------------------------------------------------- W3: wake latency


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def wake(
    options: Options,
    dbname: str,
    commands: list[list[str]],
    producer: list[str],
    *,
    name: str,
) -> Wake:
    """Measure W3: start the workers, then run the producer (`wake.wake_schedule`)."""
    sink_path = options.artifact(f"{name}.sink")
    sink_path.unlink(missing_ok=True)
    env = child_env(options, dbname, sink_path)
    with spawned(commands, env, options.artifact(name)) as workers:
        result = watched(producer, env, workers)
    reader = SinkReader(str(sink_path))
    reader.poll()
    t_commit = result.get("t_commit", [])
    latencies = [
        (reader.first_time(i) - t) * 1000.0
        for i, t in enumerate(t_commit)
        if reader.first_time(i) is not None
    ]
    count = options.wake_count

    def pct(q: float) -> float | None:
        return percentile(latencies, q) if latencies else None

    return Wake(
        count=count,
        received=len(latencies),
        p50=pct(0.50),
        p95=pct(0.95),
        p99=pct(0.99),
        max=max(latencies) if latencies else None,
        duplicates=len(reader.duplicates()),
        error=result.get("error", ""),
        latencies=latencies,
    )


def watched(
    argv: list[str], env: dict[str, str], workers: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    """Run a producer to its end, unless a worker exits first: then stop it and say so."""
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as producer:
        while producer.poll() is None:
            exits = [worker.returncode for worker in workers if worker.poll() is not None]
            if exits:
                producer.kill()
                producer.communicate()
                return {"error": f"worker exited early (codes {exits})", "t_commit": []}
            time.sleep(0.05)
        out, err = producer.communicate()
    if producer.returncode != 0:
        raise RuntimeError(f"producer {argv[2:4]} failed ({producer.returncode}):\n{err[-4000:]}")
    return json.loads(out)


def wake_args(options: Options) -> list[str]:
    return ["--n", str(options.wake_count), "--settle", str(options.wake_settle)]


# ---------------------------------------------------------------- one repetition


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_limit(options: Options, record: Record) -> None:
    """W4: the hand-written psycopg queue, each drain in its own fresh database."""
    n = options.n
    for mode, processes in LIMIT_DRAINS:
        key = f"{mode}x{processes}"
        with fresh_database(options, f"limit_{key}") as dbname:
            limit.install(dsn(options, dbname))
            if mode == "claim1":
                elapsed = limit.enqueue_single(dsn(options, dbname), n)
                record.enqueue["limit_single"] = n / elapsed
                log(f"  W4 W1 single insert: {n / elapsed:,.0f} jobs/s")
            else:
                elapsed = limit.enqueue_bulk(dsn(options, dbname), n)
                record.enqueue.setdefault("limit_bulk", n / elapsed)
                log(f"  W4 W1b bulk insert: {n / elapsed:,.0f} jobs/s")
            result = drain(
                options,
                dbname,
                limit_workers(options, dbname, mode, processes),
                name=f"limit_{key}",
                unfinished_sql=limit.UNFINISHED,
                done_once_sql=LIMIT_DONE,
            )
            record.drains[f"limit_{key}"] = result
            log(f"  W4 {key}: {describe(result)}")


def run_limit_wake(options: Options, record: Record) -> None:
    """W3 against the W4 limit: one claim1 process."""
    with fresh_database(options, "limit_w3") as dbname:
        limit.install(dsn(options, dbname))

        producer = [sys.executable, "-m", "benchmarks.limit", "wake", "--dsn", dsn(options, dbname)]
        result = wake(
            options,
            dbname,
            limit_workers(options, dbname, "claim1", 1),
            [*producer, *wake_args(options)],
            name="limit_w3",
        )
        record.wakes["limit_claim1x1"] = result
        log(f"  W4 W3 claim1x1: {describe_wake(result)}")


def run_venturi_single(options: Options, record: Record) -> None:
    """W1 then W2a, in one fresh database."""
    with fresh_database(options, "w1_w2a") as dbname:
        migrate(options, dbname)
        result = produce(options, dbname, "single", "--n", str(options.n))
        record.enqueue["single"] = result["n"] / result["elapsed"]
        log(f"  W1 single enqueue: {record.enqueue['single']:,.0f} jobs/s")
        if "w2a" in options.workloads:
            drained = drain(
                options,
                dbname,
                venturi_workers(DEFAULTS),
                name="w2a",
                unfinished_sql=VENTURI_UNFINISHED,
                done_once_sql=VENTURI_DONE_ONCE,
            )
            record.drains["w2a"] = drained
            log(f"  W2a defaults: {describe(drained)}")


def run_venturi_bulk(options: Options, record: Record) -> None:
    """W1b then one W2b cell per fresh database (the first cell drains W1b's own jobs)."""
    cells = options.grid if "w2b" in options.workloads else []
    for k, cell in enumerate(cells or [None]):
        with fresh_database(options, f"w1b_w2b_{k}") as dbname:
            migrate(options, dbname)
            result = produce(options, dbname, "bulk", "--n", str(options.n))
            if k == 0:
                record.enqueue["bulk"] = result["n"] / result["elapsed"]
                record.notes["bulk"] = (
                    f"{result['statements']} INSERT statement(s) of up to "
                    f"{result['rows_per_statement']:,} rows, {result['transactions']} "
                    "transaction (inside `transaction.atomic()`)"
                )
                log(f"  W1b enqueue_many: {record.enqueue['bulk']:,.0f} jobs/s")
            if cell is None:
                continue
            drained = drain(
                options,
                dbname,
                venturi_workers(cell),
                name=f"w2b_{k}",
                unfinished_sql=VENTURI_UNFINISHED,
                done_once_sql=VENTURI_DONE_ONCE,
            )
            record.drains[f"w2b:{cell.label()}"] = drained
            log(f"  W2b {cell.label()}: {describe(drained)}")


def run_venturi_wake(options: Options, record: Record, cells: dict[str, Cell]) -> None:
    for key, cell in cells.items():
        with fresh_database(options, f"w3_{key}") as dbname:
            migrate(options, dbname)

            producer = [sys.executable, "-m", "benchmarks.producer", "wake", *wake_args(options)]
            result = wake(options, dbname, venturi_workers(cell), producer, name=f"w3_{key}")
            record.wakes[f"{key}:{cell.label()}"] = result
            log(f"  W3 {cell.label()}: {describe_wake(result)}")


# ---------------------------------------------------------------- the PgQueuer peer

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


def pgq_drain(options: Options, dbname: str, cell: pgq.PgqCell, name: str, **kw: Any) -> Drain:
    """`drain()` with PgQueuer's workers: its unfinished jobs are the rows left in `pgqueuer`."""
    commands = pgq.worker_commands(cell)
    options = dataclasses.replace(options, pgq_dsn=pgq_url(options, dbname))
    return drain(
        options,
        dbname,
        commands,
        name=name,
        unfinished_sql=pgq.UNFINISHED,
        done_once_sql=pgq.DONE_ONCE,
        **kw,
    )


def run_pgq_single(options: Options, record: Record) -> None:
    """PgQueuer W1 (single `Queries.enqueue`) then W2a (one worker at its defaults)."""
    with pgq_database(options, "w1_w2a") as dbname:
        result = pgq_produce(options, dbname, "single", "--n", str(options.n))
        record.enqueue["pgq_single"] = result["n"] / result["elapsed"]
        log(f"  PgQueuer W1 single enqueue: {record.enqueue['pgq_single']:,.0f} jobs/s")
        if "w2a" in options.workloads:
            drained = pgq_drain(options, dbname, pgq.PGQ_DEFAULTS, "pgq_w2a")
            record.drains["pgq_w2a"] = drained
            log(f"  PgQueuer W2a defaults: {describe(drained)}")


def run_pgq_bulk(options: Options, record: Record) -> None:
    """PgQueuer W1b (one bulk `Queries.enqueue`) then one W2b cell per fresh database."""
    cells = options.pgq_grid if "w2b" in options.workloads else []
    for k, cell in enumerate(cells or [None]):
        with pgq_database(options, f"w1b_w2b_{k}") as dbname:
            result = pgq_produce(options, dbname, "bulk", "--n", str(options.n))
            if k == 0:
                record.enqueue["pgq_bulk"] = result["n"] / result["elapsed"]
                record.notes["pgq_bulk"] = (
                    f"{result['statements']} statement (`Queries.enqueue` with lists), "
                    f"{result['transactions']} transaction"
                )
                log(f"  PgQueuer W1b bulk enqueue: {record.enqueue['pgq_bulk']:,.0f} jobs/s")
            if cell is None:
                continue
            drained = pgq_drain(options, dbname, cell, f"pgq_w2b_{k}")
            record.drains[f"pgq_w2b:{cell.label()}"] = drained
            log(f"  PgQueuer W2b {cell.label()}: {describe(drained)}")


def run_pgq_wake(options: Options, record: Record, cells: dict[str, pgq.PgqCell]) -> None:
    for key, cell in cells.items():
        with pgq_database(options, f"w3_{key}") as dbname:
            producer = pgq.producer_command("wake", pgq_url(options, dbname), *wake_args(options))
            with_dsn = dataclasses.replace(options, pgq_dsn=pgq_url(options, dbname))
            result = wake(
                with_dsn, dbname, pgq.worker_commands(cell), producer, name=f"pgq_w3_{key}"
            )
            record.wakes[f"pgq_{key}:{cell.label()}"] = result
            log(f"  PgQueuer W3 {cell.label()}: {describe_wake(result)}")


def run_pgq_w2c(options: Options, record: Record, cell: pgq.PgqCell) -> None:
    """W2c: the all-done drain of many jobs (100,000) by PgQueuer's best <= 2-process cell."""
    big = dataclasses.replace(options, n=options.w2c_n)
    with pgq_database(options, "w2c") as dbname:
        pgq_produce(options, dbname, "bulk", "--n", str(big.n))
        drained = pgq_drain(big, dbname, cell, "pgq_w2c", timeout_s=w2c_timeout(big))
    record.drains[f"pgq_w2c:{cell.label()}"] = drained
    log(f"  PgQueuer W2c {big.n:,} jobs, {cell.label()}: {describe(drained)}")


def run_venturi_w2c(options: Options, record: Record, cell: Cell) -> None:
    """W2c: the all-done drain of many jobs (100,000) by venturi's best <= 2-process cell."""
    big = dataclasses.replace(options, n=options.w2c_n)
    with fresh_database(options, "w2c") as dbname:
        migrate(options, dbname)
        produce(options, dbname, "bulk", "--n", str(big.n))
        drained = drain(
            big,
            dbname,
            venturi_workers(cell),
            name="w2c",
            unfinished_sql=VENTURI_UNFINISHED,
            done_once_sql=VENTURI_DONE_ONCE,
            timeout_s=w2c_timeout(big),
        )
    record.drains[f"w2c:{cell.label()}"] = drained
    log(f"  W2c {big.n:,} jobs, {cell.label()}: {describe(drained)}")


def w2c_timeout(options: Options) -> float:
    """45 s per 10,000 jobs would be generous; 1,000 jobs/s at least, never under 45 s."""
    return max(DRAIN_TIMEOUT, options.n / 1_000)


def w2c_cells(options: Options, records: list[Record]) -> tuple[Cell, pgq.PgqCell]:
    """The best (all done in DB) W2b cell of at most 2 processes of each, else the fallbacks."""
    venturi_key = compare.best_key(records, "w2b:", "done", max_processes=2)
    pgq_key = compare.best_key(records, "pgq_w2b:", "done", max_processes=2)
    venturi = next((c for c in options.grid if f"w2b:{c.label()}" == venturi_key), W2C_CELL)
    peer = next((c for c in options.pgq_grid if f"pgq_w2b:{c.label()}" == pgq_key), pgq.PGQ_W2C)
    return venturi, peer


W6_BUILD = """
INSERT INTO django_venturi_job
    (kind, queue, priority, rank, state, payload, attempt, failures, run_at, enqueued_at,
     started_at, finished_at, claimed_by, last_error)
SELECT template.kind, template.queue, template.priority, template.rank, %(state)s,
       jsonb_set(template.payload, '{i}', to_jsonb(%(base)s + g)), %(attempt)s, 0,
       now() + %(run_in)s::interval, now(), %(finished_at)s, %(finished_at)s, '', ''
FROM (SELECT * FROM django_venturi_job ORDER BY id LIMIT 1) AS template,
     generate_series(1, %(count)s) AS g
"""
W6_OTHERS_BASE = 50_000_000
"""The `i` of the jobs the W6 worker must not take (never written to the sink)."""


def build_w6_table(options: Options, dbname: str, state: str, count: int) -> float:
    """Add `count` rows the worker will not take, in one INSERT ... SELECT; return seconds."""
    ready = state == "ready"
    params = {
        "state": "ready" if ready else "completed",
        "base": W6_OTHERS_BASE,
        "attempt": 0 if ready else 1,
        "run_in": "1 day" if ready else "-1 hour",
        "finished_at": None if ready else dt_now(),
        "count": count,
    }
    started = time.monotonic()
    with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
        conn.execute(W6_BUILD, params)
    return time.monotonic() - started


def dt_now() -> Any:
    import datetime

    return datetime.datetime.now(datetime.UTC)


def run_venturi_backlog(options: Options, record: Record) -> None:
    """W6: claim-and-complete TARGET jobs beside 10k / 1M other rows, one database each."""
    target = options.w6_target
    for key, state, count in options.w6_cases:
        with fresh_database(options, f"w6_{key}") as dbname:
            migrate(options, dbname)
            produce(options, dbname, "bulk", "--n", str(target))
            with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
                (last_target,) = conn.execute("SELECT max(id) FROM django_venturi_job").fetchone()
            built = build_w6_table(options, dbname, state, count)
            bound = f" AND id <= {int(last_target)}"
            drained = drain(
                dataclasses.replace(options, n=target),
                dbname,
                venturi_workers(W6_CELL),
                name=f"w6_{key}",
                unfinished_sql=VENTURI_UNFINISHED + bound,
                done_once_sql=VENTURI_DONE_ONCE + bound,
            )
            record.drains[f"w6:{key}"] = drained
            record.notes[f"w6:{key}"] = f"{count:,} {state} rows built in {built:.1f} s"
            log(f"  W6 {target:,} jobs beside {count:,} {state}: {describe(drained)}")


def rss_kb(pid: int) -> int | None:
    """VmRSS of a process, in kB (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run_venturi_memory(options: Options, record: Record) -> None:
    """W8: one worker; RSS after a warm-up, then every STEP jobs over JOBS more jobs."""
    warmup, jobs, step = options.w8
    started = time.monotonic()
    with fresh_database(options, "w8") as dbname:
        migrate(options, dbname)
        sink_path = options.artifact("w8.sink")
        sink_path.unlink(missing_ok=True)
        reader = SinkReader(str(sink_path))
        env = child_env(options, dbname, sink_path)
        samples: list[tuple[int, int]] = []
        error = ""
        with spawned(venturi_workers(W6_CELL), env, options.artifact("w8")) as (worker,):

            def wait_for(count: int, deadline: float) -> bool:
                while reader.poll() < count:
                    if worker.poll() is not None:
                        return False
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(SINK_POLL)
                return True

            def sample(done: int) -> None:
                kb = rss_kb(worker.pid)
                if kb is not None:
                    samples.append((done, kb))

            deadline = time.monotonic() + W8_TIMEOUT
            produce(options, dbname, "bulk", "--n", str(warmup))
            if wait_for(warmup, deadline):
                time.sleep(0.5)  # the last verdicts written, the worker idle
                sample(0)
                produce(options, dbname, "bulk", "--n", str(jobs), "--first", str(warmup))
                for mark in range(step, jobs + 1, step):
                    if not wait_for(warmup + mark, deadline):
                        break
                    sample(mark)
                time.sleep(0.5)
                if samples and samples[-1][0] == jobs:
                    samples[-1] = samples[-1][0], rss_kb(worker.pid) or samples[-1][1]
            if worker.poll() is not None:
                error = f"worker exited early (code {worker.returncode})"
            elif reader.poll() < warmup + jobs:
                error = "timeout"
        reader.poll()
        with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
            (unfinished,) = conn.execute(VENTURI_UNFINISHED).fetchone()
    record.memory = Memory(
        warmup=warmup,
        jobs=jobs,
        samples=samples,
        handled=len(reader.times),
        duplicates=len(reader.duplicates()),
        unfinished=unfinished,
        seconds=time.monotonic() - started,
        error=error,
    )
    log(f"  W8 memory: {describe_memory(record.memory)}")


def describe_memory(result: Memory) -> str:
    series = ", ".join(f"{kb / 1024:.1f}" for _, kb in result.samples)
    problems = "; ".join(result.problems())
    return (
        f"RSS {series} MB every {result.samples[1][0] if len(result.samples) > 1 else 0:,} jobs, "
        f"growth {fmt(result.growth_mb, 1)} MB, {result.seconds:.0f} s"
    ) + (f" [{problems}]" if problems else "")


DEDUP_LIVE = """
SELECT count(*) FILTER (WHERE state IN ('ready', 'running')),
       coalesce(sum((payload->>'count')::bigint) FILTER (WHERE state IN ('ready', 'running')), 0),
       coalesce(sum(merged_count) FILTER (WHERE state IN ('ready', 'running')), 0),
       count(*)
FROM django_venturi_job WHERE kind = 'bench.count'
"""


def run_venturi_dedup(options: Options, record: Record) -> None:
    """W7: 8 producers released at one start time, each N keyed enqueues over 10 keys."""
    producers, per_producer = DEDUP_PRODUCERS, options.dedup_per_producer
    with fresh_database(options, "w7") as dbname:
        migrate(options, dbname)
        env = child_env(options, dbname)
        start = time.time() + dedup_margin(producers)
        argv = [sys.executable, "-m", "benchmarks.producer", "dedup", "--n", str(per_producer)]
        argv += ["--keys", str(DEDUP_KEYS), "--start", repr(start)]
        processes = [
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(producers)
        ]
        results: list[dict[str, Any]] = []
        errors: list[str] = []
        deadline = time.monotonic() + dedup_margin(producers) + DEDUP_TIMEOUT
        for k, process in enumerate(processes):
            try:
                out, err = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
                errors.append(f"producer {k} timed out")
                continue
            if process.returncode != 0:
                last = (err.strip().splitlines() or ["?"])[-1]
                errors.append(f"producer {k} failed ({process.returncode}): {last[:200]}")
                log(err[-4000:])
                continue
            results.append(json.loads(out))
        with psycopg.connect(dsn(options, dbname), autocommit=True) as conn:
            live, count_sum, merged, rows = conn.execute(DEDUP_LIVE).fetchone()
    elapsed = rate = None
    if results and not errors:
        elapsed = max(r["t_end"] for r in results) - start
        rate = producers * per_producer / elapsed
    record.dedup = Dedup(
        producers=producers,
        per_producer=per_producer,
        keys=DEDUP_KEYS,
        elapsed=elapsed,
        rate=rate,
        live=live,
        count_sum=count_sum,
        merged=merged,
        rows=rows,
        late=sorted(r["ready"] - start for r in results if r["ready"] > start),
        slack=min((start - r["ready"] for r in results), default=None),
        errors=errors,
    )
    if rate is not None:
        record.enqueue["dedup"] = rate
    log(f"  W7 dedup under contention: {describe_dedup(record.dedup)}")


def describe_dedup(result: Dedup) -> str:
    problems = "; ".join(result.problems())
    seconds = MISSING if result.elapsed is None else f"{result.elapsed:.2f} s"
    return (
        f"{fmt(result.rate)} enqueues/s ({result.total:,} in {seconds}), "
        f"{result.live} live jobs, sum of count {result.count_sum:,}, "
        f"{result.merged:,} merges; shortest wait at the barrier {fmt(result.slack, 2)} s"
    ) + (f" [{problems}]" if problems else "")


def describe(result: Drain) -> str:
    figures = " / ".join(fmt(v) for v in (result.steady, result.startup, result.done))
    problems = "; ".join(result.problems())
    return f"{figures} jobs/s (steady / incl. start-up / all done), {result.seconds:.1f} s" + (
        f" [{problems}]" if problems else ""
    )


def describe_wake(result: Wake) -> str:
    figures = " / ".join(fmt(v, 1) for v in (result.p50, result.p95, result.p99, result.max))
    problems = "; ".join(result.problems())
    return f"p50/p95/p99/max {figures} ms, {result.received}/{result.count}" + (
        f" [{problems}]" if problems else ""
    )


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return MISSING
    return f"{value:,.{digits}f}"


# ---------------------------------------------------------------- the table


def best_cell(records: list[Record]) -> str | None:
    """The W2b cell with the highest mean "all done in DB" rate (the speed issue's metric)."""
    keys = [key for key in records[0].drains if key.startswith("w2b:")]
    if not keys:
        return None

    def score(key: str) -> float:
        return mean([r.drains[key].done for r in records if key in r.drains]) or 0.0

    return max(keys, key=score)


def mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def figure(values: Sequence[float | None], digits: int = 0) -> str:
    """The median (with two runs: their mean, then both values)."""
    present = [v for v in values if v is not None]
    if not present:
        return MISSING
    if len(present) == 1:
        return fmt(present[0], digits)
    centre = statistics.fmean(present) if len(present) == 2 else statistics.median(present)
    runs = ", ".join(fmt(v, digits) for v in present)
    return f"{fmt(centre, digits)} ({runs})"


def centre(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.fmean(present) if len(present) <= 2 else statistics.median(present)


def ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return MISSING
    return f"{value / reference:.2f}"


def build_table(options: Options, records: list[Record]) -> tuple[str, list[str]]:
    rows: list[list[str]] = []
    failures: list[str] = []
    n = options.n

    def enqueue_row(workload: str, config: str, key: str, ref_key: str, note: str = "") -> None:
        values = [r.enqueue.get(key) for r in records]
        if all(v is None for v in values):
            return
        reference = centre([r.enqueue.get(ref_key) for r in records])
        rows.append(
            [
                workload,
                config,
                "enqueue",
                f"{figure(values)} jobs/s",
                ratio(centre(values), reference),
                note,
            ]
        )

    def drain_rows(workload: str, config: str, key: str, references: dict[str, float | None]):
        results = [r.drains[key] for r in records if key in r.drains]
        if not results:
            return
        problems = sorted({p for result in results for p in result.problems()})
        for problem in problems:
            failures.append(f"{workload} {config}: {problem}")
        pauses = ", ".join(fmt(result.longest_pause) for result in results)
        note = "; ".join(problems) if problems else "ok: each i once, 0 unfinished"
        note += f"; longest pause {pauses} ms"
        for metric, label in (
            ("steady", "steady"),
            ("startup", "incl. start-up"),
            ("done", "all done in DB"),
        ):
            values = [getattr(result, metric) for result in results]
            rows.append(
                [
                    workload,
                    config,
                    label,
                    f"{figure(values)} jobs/s",
                    ratio(centre(values), references.get(metric)),
                    note,
                ]
            )

    def wake_rows(workload: str, config: str, key: str, reference_key: str) -> None:
        results = [r.wakes[key] for r in records if key in r.wakes]
        if not results:
            return
        refs = [r.wakes[reference_key] for r in records if reference_key in r.wakes]
        problems = sorted({p for result in results for p in result.problems()})
        for problem in problems:
            failures.append(f"{workload} {config}: {problem}")
        received = ", ".join(f"{result.received}/{result.count}" for result in results)
        note = "; ".join(problems) if problems else f"received {received}"
        for metric in ("p50", "p95", "p99", "max"):
            values = [getattr(result, metric) for result in results]
            reference = centre([getattr(ref, metric) for ref in refs])
            rows.append(
                [
                    workload,
                    config,
                    metric,
                    f"{figure(values, 1)} ms",
                    ratio(centre(values), reference),
                    note,
                ]
            )

    # The limit: per metric, the better of batch100 with 1 and 2 processes.
    batch_keys = [f"limit_batch100x{p}" for m, p in LIMIT_DRAINS if m == "batch100"]
    limit_best: dict[str, float | None] = {}
    for metric in ("steady", "startup", "done"):
        candidates = [
            centre([getattr(r.drains[key], metric) for r in records if key in r.drains])
            for key in batch_keys
        ]
        present = [c for c in candidates if c is not None]
        limit_best[metric] = max(present) if present else None

    bulk_note = records[0].notes.get("bulk", "")
    enqueue_row("W4 W1", "psycopg INSERT+NOTIFY, autocommit", "limit_single", "limit_single")
    enqueue_row("W4 W1b", "psycopg INSERT ... unnest(), 1 statement", "limit_bulk", "limit_bulk")
    for mode, processes in LIMIT_DRAINS:
        key = f"limit_{mode}x{processes}"
        plural = "es" if processes > 1 else ""
        drain_rows("W4 W2", f"{mode}, {processes} process{plural}", key, limit_best)
    wake_rows("W4 W3", "claim1, 1 process", "limit_claim1x1", "limit_claim1x1")

    enqueue_row("W1", "`SinkJob(i=i).enqueue()`, autocommit", "single", "limit_single")
    enqueue_row("W1b", "`venturi.enqueue_many([...])`", "bulk", "limit_bulk", bulk_note)
    drain_rows("W2a", DEFAULTS.label(), "w2a", limit_best)
    best = best_cell(records)
    for key in records[0].drains:
        if key.startswith("w2b:"):
            drain_rows("W2b", key.removeprefix("w2b:"), key, limit_best)
    if best is not None:
        drain_rows("W2b best", best.removeprefix("w2b:"), best, limit_best)
    for key in records[0].wakes:
        if not key.startswith(("limit_", "pgq_")):
            workload = "W3 (W2a config)" if key.startswith("default:") else "W3 (W2b best)"
            wake_rows(workload, key.split(":", 1)[1], key, "limit_claim1x1")

    dedups = [r.dedup for r in records if r.dedup is not None]
    if dedups:
        problems = sorted({p for result in dedups for p in result.problems()})
        for problem in problems:
            failures.append(f"W7: {problem}")
        first = dedups[0]
        config = (
            f"{first.producers} processes x {first.per_producer:,} `CountJob(key=i % "
            f"{first.keys}).enqueue()`, autocommit, `Merge.update` (count + 1)"
        )
        values = [result.rate for result in dedups]
        reference = centre([r.enqueue.get("single") for r in records])
        rate = centre(values)
        shown = ratio(rate, reference) if reference else "\u2014"
        if problems:
            note = "; ".join(problems)
        else:
            live = ", ".join(str(result.live) for result in dedups)
            sums = ", ".join(f"{result.count_sum:,}" for result in dedups)
            note = f"ok: {live} live jobs, sum of count {sums}"
        seconds = ", ".join(fmt(result.elapsed, 2) for result in dedups)
        note += f"; {first.total:,} enqueues in {seconds} s"
        note += "; ratio to W1 single enqueue" if reference else "; no W1 in this run"
        rows.append(["W7", config, "enqueue", f"{figure(values)} enqueues/s", shown, note])

    backlog_rows(options, records, rows, failures)
    memory_rows(records, rows, failures)

    header = ["workload", "configuration", "metric", "figure", "ratio to W4", "checks / notes"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * 2 + ["---"]) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    runs = len(records)
    title = (
        f"django-venturi benchmarks, N = {n:,}, {runs} run{'s' if runs > 1 else ''}"
        f"{' (quick)' if options.quick else ''}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    text = f"### {title}\n\n{code_version()}\n\n" + "\n".join(lines) + "\n"
    return text, failures


def backlog_rows(
    options: Options, records: list[Record], rows: list[list[str]], failures: list[str]
) -> None:
    """W6: one row per case and metric; the ratio is to the 10k case (flat = 1.00)."""
    results = {
        key: r.drains[f"w6:{key}"]
        for key, _, _ in options.w6_cases
        for r in records
        if f"w6:{key}" in r.drains
    }
    if not results:
        return
    first_key = options.w6_cases[0][0]
    reference = results.get(first_key)
    for key, state, count in options.w6_cases:
        result = results.get(key)
        if result is None:
            continue
        problems = result.problems()
        failures.extend(f"W6 {key}: {problem}" for problem in problems)
        others = "ready, due in 1 day" if state == "ready" else "finished (completed)"
        config = f"{options.w6_target:,} jobs beside {count:,} {others}; {W6_CELL.label()}"
        note = "; ".join(problems) if problems else "ok: each i once, 0 unfinished"
        build = next((r.notes[f"w6:{key}"] for r in records if f"w6:{key}" in r.notes), "")
        note += f"; {build}; ratio to the {options.w6_cases[0][2]:,} case (1.00 = flat)"
        for metric, label in (("steady", "steady"), ("flow", "first entry to all done in DB")):
            value = getattr(result, metric)
            base = getattr(reference, metric) if reference is not None else None
            rows.append(["W6", config, label, f"{fmt(value)} jobs/s", ratio(value, base), note])


def memory_rows(records: list[Record], rows: list[list[str]], failures: list[str]) -> None:
    """W8: RSS after the warm-up, after all jobs, and the growth."""
    memory = next((r.memory for r in records if r.memory is not None), None)
    if memory is None:
        return
    problems = memory.problems()
    failures.extend(f"W8: {problem}" for problem in problems)
    config = (
        f"{W6_CELL.label()}; {memory.warmup:,} warm-up jobs, then {memory.jobs:,} "
        "(`enqueue_many`, one transaction)"
    )
    series = ", ".join(f"{kb / 1024:.1f}" for _, kb in memory.samples)
    note = "; ".join(problems) if problems else "ok"
    note += (
        f"; VmRSS every {memory.samples[1][0]:,} jobs: {series} MB"
        if len(memory.samples) > 1
        else ""
    )
    start = memory.samples[0][1] / 1024 if memory.samples else None
    end = memory.samples[-1][1] / 1024 if memory.samples else None
    rows.append(["W8", config, "RSS after warm-up", f"{fmt(start, 1)} MB", "\u2014", note])
    rows.append(
        ["W8", config, f"RSS after {memory.jobs:,} more", f"{fmt(end, 1)} MB", "\u2014", note]
    )
    rows.append(["W8", config, "RSS growth", f"{fmt(memory.growth_mb, 1)} MB", "\u2014", note])


def draw_chart(options: Options, records: list[Record], title: str) -> None:
    """The PNG of the W2 throughputs and W3 latencies (needs matplotlib, the `bench` extra)."""
    if options.chart is None:
        return
    if not chart.available():
        log("no chart: matplotlib is not installed (pip install -e '.[bench]')")
        return
    drains: list[tuple[str, list[Drain]]] = []
    for mode, processes in LIMIT_DRAINS:
        key = f"limit_{mode}x{processes}"
        results = [r.drains[key] for r in records if key in r.drains]
        if results:
            drains.append(
                (f"W4 {mode}, {processes} process{'es' if processes > 1 else ''}", results)
            )
    for key in records[0].drains:
        if key == "w2a" or key.startswith("w2b:"):
            label = "W2a " + DEFAULTS.label() if key == "w2a" else "W2b " + key[4:]
            drains.append((label, [r.drains[key] for r in records if key in r.drains]))
    for key in records[0].drains:
        if key == "pgq_w2a" or key.startswith("pgq_w2b:"):
            cell = pgq.PGQ_DEFAULTS.label() if key == "pgq_w2a" else key[8:]
            label = f"PgQueuer {'W2a' if key == 'pgq_w2a' else 'W2b'} {cell}"
            drains.append((label, [r.drains[key] for r in records if key in r.drains]))
    wakes: list[tuple[str, list[float]]] = []
    for key in records[0].wakes:
        latencies = [t for r in records if key in r.wakes for t in r.wakes[key].latencies]
        if key.startswith("limit_"):
            label = "W4 claim1, 1 process"
        elif key.startswith("pgq_"):
            label = "PgQueuer W3 " + ("defaults" if key.startswith("pgq_default:") else "W2b best")
        else:
            label = ("W3 defaults" if key.startswith("default:") else "W3 W2b best: ") + (
                "" if key.startswith("default:") else key.split(":", 1)[1]
            )
        wakes.append((label, latencies))
    if not drains and not wakes:
        return
    chart.draw(options.chart, title=title, n=options.n, drains=drains, wakes=wakes)
    log(f"chart: {options.chart}")


# ---------------------------------------------------------------- main


Side = Callable[[Options, Record], None]


def rotated(sides: list[Side], run: int) -> list[Side]:
    """Round r starts with side r: venturi, pgqueuer, w4; then pgqueuer, w4, venturi; ..."""
    if not sides:
        return sides
    shift = run % len(sides)
    return sides[shift:] + sides[:shift]


def drain_sides(options: Options) -> list[Side]:
    """One round of W1, W1b and W2: venturi, then each peer, then the W4 limit."""
    sides: list[Side] = []

    def venturi(o: Options, r: Record) -> None:
        if o.workloads & {"w1", "w2a"}:
            run_venturi_single(o, r)
        if o.workloads & {"w1b", "w2b"}:
            run_venturi_bulk(o, r)

    def pgqueuer(o: Options, r: Record) -> None:
        if o.workloads & {"w1", "w2a"}:
            run_pgq_single(o, r)
        if o.workloads & {"w1b", "w2b"}:
            run_pgq_bulk(o, r)

    sides.append(venturi)
    if "pgqueuer" in options.peers:
        sides.append(pgqueuer)
    if "w4" in options.workloads:
        sides.append(run_limit)
    return sides


def wake_sides(options: Options, records: list[Record]) -> list[Side]:
    """One round of W3: venturi's defaults and W2b best, the peer's, and W4 claim1."""
    w3_cells = {"default": DEFAULTS}
    best = best_cell(records)
    if best is not None:
        w3_cells["best"] = next(c for c in options.grid if c.label() == best[4:])
    pgq_cells = {"default": pgq.PGQ_DEFAULTS}
    pgq_best = compare.best_key(records, "pgq_w2b:", "done")
    if pgq_best is not None:
        pgq_cells["best"] = next(c for c in options.pgq_grid if f"pgq_w2b:{c.label()}" == pgq_best)
    sides: list[Side] = [lambda o, r: run_venturi_wake(o, r, w3_cells)]
    if "pgqueuer" in options.peers:
        sides.append(lambda o, r: run_pgq_wake(o, r, pgq_cells))
    if "w4" in options.workloads:
        sides.append(run_limit_wake)
    return sides


def code_version() -> str:
    """The commit measured, and whether django_venturi/ differs from it."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "code: not a git checkout"
    dirty = git("status", "--porcelain", "--", "django_venturi").splitlines()
    if dirty:
        return f"code: {commit}, plus uncommitted changes to {len(dirty)} django_venturi/ file(s)"
    return f"code: {commit}"


def parse_cells(text: str) -> list[Cell]:
    """`PxC[xB[xV]]` cells, comma-separated: processes, concurrency, batch size, verbosity."""
    cells = []
    for spec in text.split(","):
        numbers = [int(part) for part in spec.strip().split("x")]
        if not 2 <= len(numbers) <= 4:
            raise SystemExit(f"--cells: {spec!r} is not PxC[xB[xV]]")
        cells.append(Cell(*numbers))  # type: ignore[arg-type]
    return cells


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke test: N=100, one run")
    parser.add_argument("--n", type=int, default=None, help="jobs per W1/W2 phase (10,000)")
    parser.add_argument("--repeat", type=int, default=None, help="runs of the sequence (2)")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--no-analyze", action="store_true", help="skip the ANALYZE before each drain"
    )
    parser.add_argument("--host", default=os.environ.get("VENTURI_BENCH_HOST", "127.0.0.1"))
    parser.add_argument("--port", default=os.environ.get("VENTURI_BENCH_PORT", "5432"))
    parser.add_argument("--user", default=os.environ.get("VENTURI_BENCH_USER", "postgres"))
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="where to write the table (results/latest.md; with --quick, results/quick.md)",
    )
    parser.add_argument(
        "--cells",
        default=None,
        help="W2b cells instead of the grid, e.g. 1x32x100x0,2x128 (processes x concurrency "
        "[x batch size [x verbosity]]), or `full` for the whole published grid",
    )
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="peer libraries to run beside venturi, comma-separated (pgqueuer)",
    )
    parser.add_argument("--no-peers", action="store_true", help="venturi and W4 only")
    parser.add_argument(
        "--chart",
        type=Path,
        default=None,
        help="where to draw the chart (results/latest.png; the docs show docs/benchmarks.png)",
    )
    args = parser.parse_args(argv)
    workloads = {w.strip().lower() for w in args.workloads.split(",") if w.strip()}
    unknown = workloads - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    n = args.n or (100 if args.quick else 10_000)
    if args.cells == "full":
        grid = FULL_GRID
    else:
        grid = parse_cells(args.cells) if args.cells else QUICK_GRID if args.quick else GRID
    return Options(
        n=n,
        repeat=args.repeat or (1 if args.quick else 3),
        grid=grid,
        wake_count=20 if args.quick else 200,
        wake_settle=0.5 if args.quick else 1.0,
        analyze=not args.no_analyze,
        workloads=workloads,
        dsn_base={"host": args.host, "port": str(args.port), "user": args.user},
        quick=args.quick,
        output=args.output or RESULTS_DIR / ("quick.md" if args.quick else "latest.md"),
        dedup_per_producer=QUICK_DEDUP_PER_PRODUCER if args.quick else DEDUP_PER_PRODUCER,
        w6_target=QUICK_W6_TARGET if args.quick else W6_TARGET,
        w6_cases=QUICK_W6_CASES if args.quick else W6_CASES,
        w8=QUICK_W8 if args.quick else (W8_WARMUP, W8_JOBS, W8_STEP),
        chart=args.chart or RESULTS_DIR / ("quick.png" if args.quick else "latest.png"),
        peers=set() if args.no_peers else peers(parser, args.peers),
        pgq_grid=pgq.PGQ_QUICK_GRID if args.quick else pgq.PGQ_GRID,
        w2c_n=QUICK_W2C_N if args.quick else W2C_N,
    )


def peers(parser: argparse.ArgumentParser, text: str) -> set[str]:
    """The peers asked for that can run; one that is not installed is skipped, and said so."""
    asked = {p.strip().lower() for p in text.split(",") if p.strip()}
    unknown = asked - set(PEERS)
    if unknown:
        parser.error(f"unknown peers: {', '.join(sorted(unknown))}")
    if "pgqueuer" in asked and (missing := pgq.available()):
        log(f"PgQueuer skipped ({missing}; pip install -e '.[bench]')")
        asked.discard("pgqueuer")
    return asked


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    records: list[Record] = []
    # The drains first (every repetition), then W3 (every repetition), so that
    # W3's "W2b best" is the configuration the table reports as best.
    for run in range(options.repeat):
        log(f"run {run + 1}/{options.repeat}, N = {options.n:,}: W1, W1b, W2, W4, W7")
        options.run = run
        record = Record()
        for side in rotated(drain_sides(options), run):
            side(options, record)
        if "w7" in options.workloads:
            run_venturi_dedup(options, record)
        # W6 and W8 are slow to set up and measure growth, not a rate: once per invocation.
        if run == 0 and "w6" in options.workloads:
            run_venturi_backlog(options, record)
        if run == 0 and "w8" in options.workloads:
            run_venturi_memory(options, record)
        records.append(record)
    if "w2c" in options.workloads:
        venturi_cell, pgq_cell = w2c_cells(options, records)
        for run, record in enumerate(records):
            log(f"run {run + 1}/{options.repeat}: W2c, {options.w2c_n:,} jobs")
            options.run = run
            sides = [lambda o, r: run_venturi_w2c(o, r, venturi_cell)]
            if "pgqueuer" in options.peers:
                sides.append(lambda o, r: run_pgq_w2c(o, r, pgq_cell))
            for side in rotated(sides, run):
                side(options, record)
    if "w3" in options.workloads:
        for run, record in enumerate(records):
            log(f"run {run + 1}/{options.repeat}: W3")
            options.run = run
            for side in rotated(wake_sides(options, records), run):
                side(options, record)
    table, failures = build_table(options, records)
    if options.peers:
        comparison, peer_failures = compare.build(options, records)
        table = comparison + "\n" + table
        failures += peer_failures
    elapsed = time.monotonic() - started
    footer = f"\nTotal time {elapsed:.0f} s. " + (
        "All checks passed."
        if not failures
        else "FAILED CHECKS:\n" + "\n".join(f"- {failure}" for failure in failures)
    )
    print(table + footer)
    output = options.output
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(table + footer + "\n")
    draw_chart(options, records, table.splitlines()[0].removeprefix("### "))
    raw = [dataclasses.asdict(record) for record in records]
    output.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
