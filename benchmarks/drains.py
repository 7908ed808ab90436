"""W1, W1b, W2a, W2b and W2c: the enqueue and drain phases of venturi, PgQueuer and W4.

Each in fresh databases: W1 (single enqueues) then W2a (one worker at the defaults)
in one; W1b (one bulk enqueue) then one W2b grid cell per database; W2c, the
all-done drain of 100,000 jobs by each library's best cell of at most 2 processes
(`w2c_cells`). `run_limit` is W4, the hand-written psycopg queue, enqueued and
drained the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmarks import compare, limit
from benchmarks import peer_pgqueuer as pgq
from benchmarks.config import DEFAULTS, LIMIT_DRAINS, W2C_CELL, Cell, Options
from benchmarks.harness import (
    DRAIN_TIMEOUT,
    LIMIT_DONE,
    VENTURI_DONE_ONCE,
    VENTURI_UNFINISHED,
    drain,
    dsn,
    fresh_database,
    limit_workers,
    log,
    migrate,
    pgq_database,
    pgq_produce,
    pgq_url,
    produce,
    venturi_workers,
)
from benchmarks.results import Drain, Record, describe

# ---------------------------------------------------------------- venturi


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


# ---------------------------------------------------------------- the W4 limit


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


# ---------------------------------------------------------------- the PgQueuer peer


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


# ---------------------------------------------------------------- W2c


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
