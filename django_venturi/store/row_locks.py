"""Which rows a `SELECT ... FOR UPDATE` locks, on each database.

PostgreSQL and MySQL 8 lock only the queried table's rows with `FOR UPDATE OF`, not
those of the tables a filter joins. MariaDB has no `OF`: there the statement locks
the joined rows as well, which the store's locking reads can afford (they join
nothing another transaction writes while it waits on them).
"""

from __future__ import annotations

from django.db import connections


def own_rows(alias: str) -> tuple[str, ...]:
    """`select_for_update(of=...)`: the queried table's rows only, where the database
    can say so; elsewhere nothing, and the statement locks every row it reads."""
    return ("self",) if connections[alias].features.has_select_for_update_of else ()
