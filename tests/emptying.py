"""Emptying the tables after each transactional test, in a few milliseconds.

Django's `TransactionTestCase` ends each test with `flush`: a TRUNCATE of every
table (on PostgreSQL about 120 ms for this project's 20 tables: each one gets new
files) and then the `post_migrate` signal, which writes the content types and
permissions again (15 ms more, 40 ms on SQLite). Most of the suite's tests are
transactional, since real worker processes must see what a test writes: the
flushes took about three of the default suite's eleven minutes.

`empty_tables` leaves the tables as empty as `flush` does, the same way on every
database: the content types and permissions stay (what `post_migrate` would
write again, with new ids), every other table of the project's models loses its
rows in one transaction. On PostgreSQL it first counts what each table holds (up
to `MANY`), in one statement: a table with many rows is truncated, so no test
leaves a large table of dead rows behind it for the next one's plans, and the
others are emptied with DELETE, which costs nothing on an empty table (Django's
foreign keys are deferred, so the order does not matter). Sequences go on, as
after `flush` (which this project's tests call without `reset_sequences`).

Installed by `tests/conftest.py` for every transactional test that names no
`available_apps` and no serialized rollback (those keep Django's own flush).
"""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction
from django.test import TransactionTestCase

KEPT = frozenset({"django_content_type", "auth_permission"})
"""Written at migrate by `post_migrate`, and again after every `flush`: kept instead."""

MANY = 1000
"""A table holding at least this many rows is truncated rather than deleted from."""


def empty_tables(alias: str) -> None:
    connection = connections[alias]
    tables = [
        table
        for table in connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        if table not in KEPT
    ]
    if not tables:
        return
    quote = connection.ops.quote_name
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if connection.vendor == "mysql":  # foreign keys are checked at once there
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        if connection.vendor != "postgresql":
            for table in tables:
                cursor.execute(f"DELETE FROM {quote(table)}")
            if connection.vendor == "mysql":
                cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
            return
        cursor.execute(
            " UNION ALL ".join(
                f"SELECT {index}, (SELECT count(*) FROM (SELECT FROM {quote(table)} "
                f"LIMIT {MANY}) AS held)"
                for index, table in enumerate(tables)
            )
        )
        held = {tables[index]: count for index, count in cursor.fetchall()}
        many = [table for table, count in held.items() if count >= MANY]
        if many:  # first: TRUNCATE refuses a table with pending deferred checks
            cursor.execute(f"TRUNCATE {', '.join(map(quote, many))} CASCADE")
        for table, count in held.items():
            if 0 < count < MANY:
                cursor.execute(f"DELETE FROM {quote(table)}")


_django_teardown = TransactionTestCase._fixture_teardown


def _fixture_teardown(self: Any) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        _django_teardown(self)
        return
    for alias in self._databases_names(include_mirrors=False):
        empty_tables(alias)


def install() -> None:
    """Empty the tables with `empty_tables` after each transactional test."""
    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[method-assign]
