"""Database connections of threads that no request cycle cleans up.

Django closes a broken or obsolete connection at the start and end of each
request (`close_old_connections`). A worker's threads have no requests: the
handler threads and the main thread close theirs after each job or failure,
and this module does the same for the threads of `sync_to_async`, where the
ORM calls of `async def` handlers run. Without it, a connection broken by a
database restart would stay broken in such a thread, failing every run there.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django import db
from django.db import connections

DATABASE_ERRORS = (db.OperationalError, db.InterfaceError)
"""What a database that went away raises."""

P = ParamSpec("P")
R = TypeVar("R")


def close_broken_connections() -> None:
    """Close this thread's connections that no longer work, so their next use reconnects.

    One round trip per open connection (`is_usable()`): for after a failure, not
    for every job.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and not connection.is_usable():
            connection.close()


def reachable(alias: str) -> bool:
    """Whether this thread reaches the database (connecting, then a round trip); if not,
    its connection is closed so that the next try reconnects."""
    connection = connections[alias]
    with contextlib.suppress(*DATABASE_ERRORS):
        connection.ensure_connection()
        if connection.is_usable():
            return True
    with contextlib.suppress(*DATABASE_ERRORS):
        connection.close()
    return False


def closing_broken_on_error(function: Callable[P, R]) -> Callable[P, R]:
    """`function`, closing this thread's broken connections when it raises a database error."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except DATABASE_ERRORS:
            close_broken_connections()
            raise

    return wrapper
