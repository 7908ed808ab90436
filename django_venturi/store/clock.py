"""Database time: what every process compares `run_at`, leases and ages against.

PostgreSQL's `now()` is the one clock all workers share. SQLite stores
datetimes as text in Django's format and has no clock Django can compare with,
so there this host's clock stands in: SQLite is single-host, so it is the same
clock for every process anyway.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connections
from django.db.models.functions import Now
from django.utils import timezone


def now_expression(alias: str) -> Now | datetime:
    """`now()` for ORM filters and updates (a value on SQLite)."""
    return Now() if connections[alias].vendor == "postgresql" else timezone.now()


def database_time(alias: str, *, statement: bool = False) -> datetime:
    """The current database time, as a value.

    By default the time the current transaction started (`now()`), so it agrees
    with every `now()` the same transaction writes. With `statement=True` the
    time this statement started, which is what a read-only report wants: rows
    written with Django's `Now()` (`STATEMENT_TIMESTAMP()` on PostgreSQL) later
    in a long transaction are not in its future.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()" if statement else "SELECT now()")
        row = cursor.fetchone()
    assert row is not None and isinstance(row[0], datetime)
    return row[0]


def check_representable(value: datetime, name: str) -> None:
    """Refuse an aware datetime that is outside the years 1 to 9999 once in UTC.

    The database stores it in UTC; Python could not read such a row back, so
    every query that loads it (the admin, `history()`) would fail.
    """
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"{name} {value.isoformat()} is outside the years 1 to 9999 in UTC"
        ) from None
