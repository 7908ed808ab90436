"""W8, worker memory (this suite's own workload): one worker's RSS over many jobs.

`run_venturi_memory` samples the worker's VmRSS (`rss_kb`, from /proc) after a
warm-up, then every W8_STEP jobs over W8_JOBS more (`Options.w8`);
`describe_memory` is its line in the progress log.
"""

from __future__ import annotations

import time

import psycopg

from benchmarks.config import W6_CELL, W8_TIMEOUT, Options
from benchmarks.harness import (
    SINK_POLL,
    VENTURI_UNFINISHED,
    child_env,
    dsn,
    fresh_database,
    log,
    migrate,
    produce,
    spawned,
    venturi_workers,
)
from benchmarks.results import Memory, Record, fmt
from benchmarks.sink import SinkReader


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
