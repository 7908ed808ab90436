"""W3, wake latency: its measurement (WORKLOAD.md W3) and its phases.

`wake` starts the workers, then runs a producer on `benchmarks.wake`'s absolute
schedule and takes each job's latency from its commit to its handler's entry;
`percentile` interpolates as numpy does by default. The phases: venturi at its
defaults and with its W2b best cell, PgQueuer likewise, and the W4 limit's claim1
worker.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import limit
from benchmarks import peer_pgqueuer as pgq
from benchmarks.config import Cell, Options
from benchmarks.harness import (
    child_env,
    dsn,
    fresh_database,
    limit_workers,
    log,
    migrate,
    pgq_database,
    pgq_url,
    spawned,
    venturi_workers,
)
from benchmarks.results import Record, Wake, describe_wake
from benchmarks.sink import SinkReader

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


# ---------------------------------------------------------------- the phases


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


def run_venturi_wake(options: Options, record: Record, cells: dict[str, Cell]) -> None:
    for key, cell in cells.items():
        with fresh_database(options, f"w3_{key}") as dbname:
            migrate(options, dbname)

            producer = [sys.executable, "-m", "benchmarks.producer", "wake", *wake_args(options)]
            result = wake(options, dbname, venturi_workers(cell), producer, name=f"w3_{key}")
            record.wakes[f"{key}:{cell.label()}"] = result
            log(f"  W3 {cell.label()}: {describe_wake(result)}")


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
