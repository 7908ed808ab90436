"""Writes that PostgreSQL picks as a deadlock victim, tried again.

A caller's write that locks rows in one order (a dedup merge, a cancel, both in
id order) can form a cycle with a worker's verdict batch, which locks its rows
in its own order. PostgreSQL then aborts one of them (SQLSTATE 40P01). The
worker's side retries its batch; a caller's side runs in a savepoint through
`retrying_deadlocks`, so a victim's part is rolled back and tried again, and the
caller's own transaction goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, transaction

DEADLOCK_SQLSTATE = "40P01"
TRIES = 5
"""Tries in all of one write that PostgreSQL keeps picking as a deadlock victim."""

R = TypeVar("R")


def is_deadlock(error: BaseException) -> bool:
    """Whether a database error is PostgreSQL's deadlock victim (SQLSTATE 40P01)."""
    return getattr(error.__cause__, "sqlstate", None) == DEADLOCK_SQLSTATE


def retrying_deadlocks(alias: str, write: Callable[[], R], *, tries: int = TRIES) -> R:
    """`write()` in a savepoint on `alias`, tried again (up to `tries` in all) while it is
    picked as a deadlock victim; any other error, or the last deadlock, is raised."""
    for _ in range(tries - 1):
        try:
            with transaction.atomic(using=alias):
                return write()
        except OperationalError as error:
            if not is_deadlock(error):
                raise  # else the savepoint rolled our part back: try again
    with transaction.atomic(using=alias):
        return write()
