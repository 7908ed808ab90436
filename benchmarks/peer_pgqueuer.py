"""The PgQueuer peer: WORKLOAD.md's W1, W1b, W2 and W3 against PgQueuer (asyncpg, uvloop).

`run.py` drives it exactly as it drives venturi and the W4 limit: the schema goes
in through PgQueuer's own tool (`python -m pgqueuer install`, i.e. `pgq install`),
the producers run as processes of their own (`python -m benchmarks.peer_pgqueuer
single|bulk|wake`, one JSON object on stdout), and the workers are PgQueuer's
documented worker entrypoint, `pgqueuer.run(factory, batch_size=...)` under uvloop, with the
logging `pgq run` sets up (INFO): `python -m benchmarks.peer_pgqueuer worker [--batch-size B]`.
(`pgq run` itself fails at start-up with typer 0.29: its `--log-level` parser hands a str
where an enum is expected.) Its one entrypoint,
"noop", is an `async def` whose handler calls `benchmarks.sink.handle(i)`; the
payload is `i` as ASCII bytes.

PgQueuer deletes a job's row from `pgqueuer` once its completion is logged (in
batches), so "unfinished" is the rows left in `pgqueuer`, and "finished after one
run" the `successful` rows of `pgqueuer_log`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from benchmarks import sink
from benchmarks.wake import wake_schedule

if TYPE_CHECKING:
    from pgqueuer import PgQueuer, Queries

DSN_ENV = "PEERBENCH_PGQ_DSN"
"""The worker factory reads its database from this variable (set by the harness)."""
ENTRYPOINT = "noop"
UNFINISHED = "SELECT count(*) FROM pgqueuer"
DONE_ONCE = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
DEFAULT_BATCH = 10
"""`pgq run`'s default --batch-size."""


@dataclasses.dataclass(frozen=True)
class PgqCell:
    """One PgQueuer worker configuration: processes x `pgq run --batch-size`."""

    processes: int
    batch_size: int | None = None

    def label(self) -> str:
        plural = "es" if self.processes > 1 else ""
        if self.batch_size is None:
            return f"{self.processes} process{plural}, defaults (batch {DEFAULT_BATCH}, INFO)"
        return f"{self.processes} process{plural}, batch {self.batch_size}"

    def flags(self) -> list[str]:
        return [] if self.batch_size is None else ["--batch-size", str(self.batch_size)]


PGQ_DEFAULTS = PgqCell(1)
PGQ_GRID = [PgqCell(1, 10), PgqCell(1, 200), PgqCell(2, 10), PgqCell(2, 200)]
PGQ_QUICK_GRID = [PgqCell(2, 200)]
PGQ_W2C = PgqCell(2, 200)
"""The 100k drain's configuration when the grid did not run (measured best elsewhere)."""


def available() -> str | None:
    """None when PgQueuer, asyncpg and uvloop import; otherwise what is missing."""
    missing = [m for m in ("pgqueuer", "asyncpg", "uvloop") if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def version() -> str:
    from importlib.metadata import version as installed

    return installed("pgqueuer")


# ---------------------------------------------------------------- harness side


def install(dsn: str, env: dict[str, str]) -> None:
    """`pgq install` into the (fresh) database, through PgQueuer's own CLI."""
    argv = [sys.executable, "-m", "pgqueuer", "install"]
    done = subprocess.run(
        argv, env={**env, "PGDSN": dsn}, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgq install failed ({done.returncode}):\n{done.stderr[-4000:]}")


def worker_commands(cell: PgqCell) -> list[list[str]]:
    """`pgqueuer.run` of the benchmark factory (what `pgq run` calls), once per process."""
    argv = [sys.executable, "-m", "benchmarks.peer_pgqueuer", "worker", *cell.flags()]
    return [argv] * cell.processes


def producer_command(mode: str, dsn: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.peer_pgqueuer", mode, "--dsn", dsn, *extra]


# ---------------------------------------------------------------- worker side


async def noop(job: Any) -> None:
    """The W2/W3 handler: the sink on entry, nothing else."""
    sink.handle(int(job.payload))


@contextlib.asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The factory `pgq run` loads: one asyncpg connection, one "noop" entrypoint."""
    import asyncpg
    from pgqueuer import PgQueuer

    connection = await asyncpg.connect(os.environ[DSN_ENV])
    try:
        pgq = PgQueuer.from_asyncpg_connection(connection)
        pgq.entrypoint(ENTRYPOINT)(noop)
        yield pgq
    finally:
        await connection.close()


def work(batch_size: int | None) -> None:
    """What `pgq run benchmarks.peer_pgqueuer:create_pgqueuer` does: logging, then
    `pgqueuer.run` on uvloop, SIGTERM/SIGINT stopping it; PgQueuer's defaults elsewhere."""
    import uvloop
    from pgqueuer import run
    from pgqueuer.core import logconfig

    logconfig.setup_fancy_logger(logconfig.LogLevel.INFO)
    options = {} if batch_size is None else {"batch_size": batch_size}
    uvloop.run(run(create_pgqueuer, **options))


# ---------------------------------------------------------------- producers


async def connect(dsn: str) -> tuple[Any, Queries]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    connection = await asyncpg.connect(dsn)
    return connection, Queries(AsyncpgDriver(connection))


def payload(i: int) -> bytes:
    return b"%d" % i


async def single(dsn: str, n: int) -> dict[str, float | int]:
    """W1: n `Queries.enqueue("noop", payload)` calls, each its own (autocommit) statement."""
    connection, queries = await connect(dsn)
    try:
        began = time.perf_counter()
        for i in range(n):
            await queries.enqueue(ENTRYPOINT, payload(i))
        elapsed = time.perf_counter() - began
    finally:
        await connection.close()
    return {"n": n, "elapsed": elapsed, "statements": n, "transactions": n}


async def bulk(dsn: str, n: int) -> dict[str, float | int]:
    """W1b: one `Queries.enqueue([...], [...], [...])` of n jobs, building the lists included."""
    connection, queries = await connect(dsn)
    try:
        began = time.perf_counter()
        ids = await queries.enqueue([ENTRYPOINT] * n, [payload(i) for i in range(n)], [0] * n)
        elapsed = time.perf_counter() - began
    finally:
        await connection.close()
    assert len(ids) == n
    return {"n": n, "elapsed": elapsed, "statements": 1, "transactions": 1}


def wake(dsn: str, *, count: int, interval: float, settle: float, wait: float) -> dict[str, Any]:
    """W3's producer: connected before the loop, one autocommit enqueue per job."""
    import uvloop

    loop = uvloop.new_event_loop()
    try:
        connection, queries = loop.run_until_complete(connect(dsn))

        def enqueue(i: int) -> None:
            loop.run_until_complete(queries.enqueue(ENTRYPOINT, payload(i)))

        result = wake_schedule(
            enqueue,
            count=count,
            interval=interval,
            sink_path=os.environ[sink.SINK_ENV],
            settle=settle,
            wait=wait,
        )
        loop.run_until_complete(connection.close())
    finally:
        loop.close()
    return result


def run_async(make: Callable[[], Any]) -> Any:
    import uvloop

    return uvloop.run(make())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="one PgQueuer worker (pgqueuer.run)")
    worker.add_argument("--batch-size", type=int, default=None)
    for name in ("single", "bulk", "wake"):
        command = sub.add_parser(name)
        command.add_argument("--dsn", required=True)
        command.add_argument("--n", type=int, default=200 if name == "wake" else 10_000)
        if name == "wake":
            command.add_argument("--interval", type=float, default=0.020)
            command.add_argument("--settle", type=float, default=1.0)
            command.add_argument("--wait", type=float, default=15.0)
    args = parser.parse_args(argv)
    if args.command == "worker":
        work(args.batch_size)
        return 0
    if args.command == "single":
        result = run_async(lambda: single(args.dsn, args.n))
    elif args.command == "bulk":
        result = run_async(lambda: bulk(args.dsn, args.n))
    else:
        result = wake(
            args.dsn, count=args.n, interval=args.interval, settle=args.settle, wait=args.wait
        )
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
