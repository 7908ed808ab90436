"""Saying so when venturi's tables do not exist: its migrations were never applied.

A project that enqueues before `manage.py migrate` would otherwise meet the
database's own words (`relation "django_venturi_job" does not exist`, `no such
table: django_venturi_job`). The writers catch the error they already got (no
query and no cost while the tables exist) and ask `explained` for a clearer one.
"""

from __future__ import annotations

from django.db import DatabaseError

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
