"""The hot statements on PostgreSQL: server-side prepared, results in binary.

Django's psycopg backend binds parameters on the client: Python quotes every
value (each element of the claim's and the verdict write's arrays) into the SQL
text, and PostgreSQL parses the whole text again on each call. The few
statements on the hot path (claim, verdict write, enqueue) go through `fetch()`
instead. It runs them on a plain psycopg cursor over Django's own connection
(so the same transaction, the same error wrapping into `django.db` errors, and
the query log when it is on), with `prepare=True`: PostgreSQL parses each one
once per connection and plans it for each call's values (see
`_ready_to_prepare`). Values travel apart from the text and results come in
binary, both handled by psycopg in C.

Django leaves psycopg's automatic preparing off (`prepare_threshold=None`), to
keep transaction-mode connection poolers working. Preparing here is explicit and
limited to these statements; the automatic threshold of the connection is
raised only so that psycopg honours the explicit requests, never to prepare
Django's own queries (its client-side cursors never prepare), and only on a
connection left at Django's default. Behind a pooler that does not support
prepared statements (PgBouncer before 1.21, or
`max_prepared_statements = 0`), set `VENTURI["PREPARED_STATEMENTS"] = False`.
"""

from __future__ import annotations

import functools
import re
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections

from django_venturi.conf import venturi_settings

ONLY_WHEN_ASKED = 2**31 - 1
"""A `prepare_threshold` that no query reaches by repetition alone."""

Params = Sequence[Any] | Mapping[str, Any]

NO_JIT = "SET jit = off"
"""For the claim: beside a large backlog its estimated cost passes `jit_above_cost`,
and compiling it took 80 ms of a 110 ms claim."""

CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"
"""For the claim and the verdict write: PostgreSQL plans a prepared statement for
its parameters five times, then may switch to one generic plan, which for these
is a scan of the whole table (hundreds of ms beside a large backlog). With this
setting each call is planned for its own values. An enqueue, whose plan is the
same for any values, keeps the generic plan on a connection that only enqueues
(a web process): planning it on every call cost 15 % of a single enqueue."""

WORKER_SESSION = (NO_JIT, CUSTOM_PLANS)
"""The settings of the connections that claim and write verdicts, the worker's own."""

_applied: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
"""The session settings run on each psycopg connection."""


def fetch(
    alias: str, sql: str, params: Params, *, session: Sequence[str] = ()
) -> list[tuple[Any, ...]]:
    """Run one statement on `alias` and return its rows (none for a statement without).

    `session`: SET statements to run once on the connection first, when it is
    outside a transaction (a SET inside one would roll back with it). Until they
    have run, the statement is not prepared: an unnamed statement is planned for
    its values on every call, whatever the session's `plan_cache_mode`.
    """
    connection = connections[alias]
    if (
        connection.vendor != "postgresql"
        or not venturi_settings.PREPARED_STATEMENTS
        or connection.execute_wrappers
    ):
        # Wrappers installed with connection.execute_wrapper() see every query.
        prime_session(alias, session)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
    return _fetch_prepared(connection, sql, params, session)


def _fetch_prepared(
    connection: Any, sql: str, params: Params, session: Sequence[str]
) -> list[tuple[Any, ...]]:
    import psycopg

    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    started = time.monotonic()
    with connection.wrap_database_errors:
        raw = connection.connection
        prepare = _set_session(raw, session) and _ready_to_prepare(raw)
        with psycopg.Cursor(raw) as cursor:
            cursor.execute(_binary_arrays(sql), params, prepare=prepare, binary=True)
            rows = cursor.fetchall() if cursor.description else []
    if connection.queries_logged:
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return rows


_ARRAY_PARAMETER = re.compile(r"%(\([^)]+\))?s(::\w+\[\])")


@functools.lru_cache(maxsize=64)
def _binary_arrays(sql: str) -> str:
    """`sql` with its array parameters (`%(name)s::text[]`) sent in binary (`%(name)b`).

    In text, psycopg quotes each element of an array with a regular expression
    (escaping the JSON of a result or a traceback), which was a fifth of a
    worker's CPU time; in binary the elements go as they are. Django's own
    cursors, on the unprepared path, bind on the client and take `%s` only.
    """
    return _ARRAY_PARAMETER.sub(r"%\1b\2", sql)


def _outside_transaction(raw: Any) -> bool:
    from psycopg.pq import TransactionStatus

    return bool(raw.autocommit) and raw.info.transaction_status == TransactionStatus.IDLE


def prime_session(alias: str, session: Sequence[str]) -> None:
    """Run `session`'s SET statements on `alias` now, if it is outside a transaction.

    `fetch(session=...)` does it itself; a caller about to open a transaction
    and run `fetch(session=...)` in it calls this first.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql" or not session:
        return
    connection.ensure_connection()
    with connection.wrap_database_errors:
        _set_session(connection.connection, session)


def _set_session(raw: Any, session: Sequence[str]) -> bool:
    """Run the statements of `session` not yet run on `raw`; True once all have run."""
    applied = _applied.setdefault(raw, set())
    for statement in session:
        if statement in applied:
            continue
        if not _outside_transaction(raw):
            return False
        raw.execute(statement)
        applied.add(statement)
    return True


def _ready_to_prepare(raw: Any) -> bool:
    """Set the connection up for our prepared statements once; False if it cannot be.

    A connection whose `prepare_threshold` is still None (Django's default) gets
    a threshold that only explicit requests reach, so psycopg prepares our
    statements and never Django's. A connection set up otherwise by the project
    runs ours unnamed: server-side binding, custom plan, no prepare.
    """
    if raw.prepare_threshold == ONLY_WHEN_ASKED:
        return True
    if raw.prepare_threshold is not None:
        return False
    raw.prepare_threshold = ONLY_WHEN_ASKED
    return True
