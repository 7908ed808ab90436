"""Saying so when venturi's tables do not exist: its migrations were never applied.

A project that enqueues before `manage.py migrate` would otherwise meet the
database's own words (`relation "django_venturi_job" does not exist`, `no such
table: django_venturi_job`). The writers wrap their write in `explaining`, which
turns the error they already got into a clearer one (`explained`): no query and
no cost while the tables exist.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import DatabaseError, OperationalError, ProgrammingError

TABLE_PREFIX = "django_venturi_"
"""Every table of venturi's models starts with it."""
UNDEFINED_TABLE = "42P01"
"""PostgreSQL's SQLSTATE for a table that does not exist."""


def explained(alias: str, error: DatabaseError) -> DatabaseError | None:
    """An error of the same class that names the missing migrations and the command to
    run, when `error` says one of venturi's tables does not exist on `alias`; else None."""
    said = str(error)
    if TABLE_PREFIX not in said:
        return None
    undefined = getattr(error.__cause__, "sqlstate", None) == UNDEFINED_TABLE
    if not undefined and "no such table" not in said:  # SQLite's words
        return None
    first_line = said.splitlines()[0] if said else type(error).__name__
    return type(error)(
        f"{first_line}: django_venturi's migrations are not applied on database {alias!r}. "
        f"Run 'manage.py migrate' (or 'manage.py migrate django_venturi --database {alias}'); "
        f"'manage.py check --database {alias}' lists what is missing."
    )


@contextlib.contextmanager
def explaining(alias: str) -> Iterator[None]:
    """Raise `explained`'s clearer error, chained to the first, for a missing table of
    venturi's on `alias`; any other error as it is."""
    try:
        yield
    except (ProgrammingError, OperationalError) as error:  # PostgreSQL's, SQLite's
        clearer = explained(alias, error)
        if clearer is None:
            raise
        raise clearer from error
