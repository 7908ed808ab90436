"""Turns between maintenance and cleanup: one maintenance run at a time, never during a cleanup.

Both hold one advisory lock (`MAINTENANCE_LOCK_KEY`) on a connection of their own
for the whole run: a cleanup shares it, a maintenance run takes it alone. A
maintenance run that finds it taken does not start; a cleanup that finds it taken
alone waits, trying again every `CLEANUP_RETRY` seconds, unless it runs inside a
transaction (then it goes on at once, beside the maintenance run).

Why session locks on an idle autocommit connection, and tries rather than waits:
`REINDEX CONCURRENTLY` waits for every transaction of the database that holds a
snapshot older than its own, and an open transaction (even idle, even one that
only took a lock) or a statement waiting for a lock holds one. A holder like that
would make the rebuild wait for the end of the run that is waiting for it. The
holder connects to `LISTEN_DATABASE` when it is given (a direct connection: a
session lock behind a transaction-mode pooler could be released on another
server connection). Off PostgreSQL there is nothing to take: SQLite has one
writer anyway, and maintenance refuses it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_venturi.conf import venturi_settings
from django_venturi.store.connections import connection_params

if TYPE_CHECKING:
    import psycopg

MAINTENANCE_LOCK_KEY = 0x76656E7475726903
"""The advisory lock id of maintenance and cleanup runs (b"venturi" and 3)."""
CLEANUP_RETRY = 1.0
"""Seconds between a waiting cleanup's tries."""


@contextlib.contextmanager
def cleanup_turn(alias: str) -> Iterator[None]:
    """Hold the lock shared for the block, waiting while a maintenance run holds it."""
    if connections[alias].vendor != "postgresql":
        yield
        return
    with _holder(alias) as holder:
        # Inside a transaction (ATOMIC_REQUESTS, a caller's atomic block) the cleanup
        # goes on at once: its transaction's snapshot would make the rebuild wait for it.
        while not _try(holder, "pg_try_advisory_lock_shared"):
            if connections[alias].in_atomic_block:
                break
            time.sleep(CLEANUP_RETRY)
        yield


@contextlib.contextmanager
def maintenance_turn(alias: str) -> Iterator[bool]:
    """Hold the lock alone for the block if it is free; yield whether it was."""
    with _holder(alias) as holder:
        yield _try(holder, "pg_try_advisory_lock")


def _try(holder: psycopg.Connection[Any], function: str) -> bool:
    row = holder.execute(f"SELECT {function}(%s)", [MAINTENANCE_LOCK_KEY]).fetchone()
    return bool(row and row[0])


@contextlib.contextmanager
def _holder(alias: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection whose session locks end with it."""
    import psycopg

    direct = venturi_settings.LISTEN_DATABASE if alias == venturi_settings.DATABASE else alias
    with (
        connections[alias].wrap_database_errors,
        psycopg.connect(**connection_params(direct), autocommit=True) as holder,
    ):
        yield holder
