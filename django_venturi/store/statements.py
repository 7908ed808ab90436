"""The hot statements on PostgreSQL: server-side prepared, results in binary.

Django's psycopg backend binds parameters on the client: Python quotes every
value (each element of the claim's and the verdict write's arrays) into the SQL
text, and PostgreSQL parses the whole text again on each call. The few
statements on the hot path (claim, verdict write, enqueue) go through `fetch()`
instead. It runs them on a plain psycopg cursor over Django's own connection
(so the same transaction, the same error wrapping into `django.db` errors, and
the query log when it is on), with `prepare=True`: PostgreSQL parses each one
once per connection (see `_ready_to_prepare`) and plans it for each call's
values, or once for all (the claim), as the `plan_cache_mode` of its
session settings says. Values travel apart from the text and results come in
binary, both handled by psycopg in C.

Django leaves psycopg's automatic preparing off (`prepare_threshold=None`), to
keep transaction-mode connection poolers working. Preparing here is explicit and
limited to these statements; the automatic threshold of the connection is
raised only so that psycopg honours the explicit requests, never to prepare
Django's own queries (its client-side cursors never prepare), and only on a
connection left at Django's default.

Behind a transaction-mode pooler (PgBouncer, found out by `_behind_pooler`),
consecutive statements of one client may run on different server connections,
each shared with other clients: a prepared statement would be missing from the
next one, and a session `SET` would be lost for us and left to whoever gets
that server connection next. There these statements run unnamed, and their
settings are made local to the statement's own transaction (`_fetch_pooled`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created

from django_venturi.conf import venturi_settings

ONLY_WHEN_ASKED = 2**31 - 1
"""A `prepare_threshold` that no query reaches by repetition alone."""

Params = Sequence[Any] | Mapping[str, Any]
Setting = tuple[str, str]
"""A run-time setting of PostgreSQL and its value."""

NO_JIT: Setting = ("jit", "off")
"""For the claim: beside a large backlog its estimated cost passes `jit_above_cost`,
and compiling it took 80 ms of a 110 ms claim."""

CUSTOM_PLANS: Setting = ("plan_cache_mode", "force_custom_plan")
"""For the verdict write and the sweeps:
PostgreSQL plans a prepared statement for its parameters five times, then may
switch to one generic plan, which for these could be a scan of the whole table
(hundreds of ms beside a large backlog, measured on an earlier claim). With this
setting each call is planned for its own values. An enqueue, whose plan is the
same for any values, keeps the generic plan on a connection that only enqueues
(a web process): planning it on every call cost 15 % of a single enqueue."""

GENERIC_PLAN: Setting = ("plan_cache_mode", "force_generic_plan")
"""For a statement whose shape, not its values, decides its plan (the claim, with or
without capped and rate-limited kinds): planned once per connection instead of on
every call. Planning that claim for its values took 0.6 ms of the 1.2 ms a claim
of one job costs, and the claim is most of a wake-up's latency."""

INDEX_SCANS: tuple[Setting, ...] = (("enable_seqscan", "off"), ("enable_bitmapscan", "off"))
"""With a generic plan: every step of the claim is an ordered range of an
index. A generic plan is made once and kept until the table is next analyzed, so
one made on an empty table (a worker idle since the last cleanup) scanned the
whole table in every claim once a backlog arrived: 20,000 jobs drained at 6,000
jobs/s instead of 18,000. With these, the planner takes the indexes whatever its
statistics say."""

NO_SORTS: Setting = ("enable_sort", "off")
"""With a generic plan of the claim of a fair kind: its probes of each key's jobs read
the fair index in its order. Planned while the table's statistics said it was nearly
empty (a burst after a quiet spell, before autovacuum's next analyze), they read
another index and sorted: each probe scanned the whole backlog (0.7 s a claim of
20,000 jobs). The claim's other sorts have no alternative and stay."""

SORTS: Setting = ("enable_sort", "on")

PLANNER_DEFAULTS: tuple[Setting, ...] = (
    ("enable_seqscan", "on"),
    ("enable_bitmapscan", "on"),
    SORTS,
)
"""What the worker's other statements run with, on a connection the claim set
to index scans only."""

FOR_PREPARED: tuple[Setting, ...] = (GENERIC_PLAN, *INDEX_SCANS, NO_SORTS)
"""Settings that serve a statement prepared once for all calls: left off a connection
whose project prepares its own statements (we do not prepare on it), where they
would apply to the project's statements instead."""

WORKER_SESSION = (NO_JIT, CUSTOM_PLANS, *PLANNER_DEFAULTS)
"""The settings of the worker's statements but the claim."""

OWN_TRANSACTIONS_BOUNDED: Setting = ("idle_in_transaction_session_timeout", "5s")
"""On the connections of the worker's own loops (claiming, recovering, writing results,
heartbeats; never a handler's, whose transactions are the project's): a worker frozen
in the middle of one of its transactions (SIGSTOP, a paused VM, a host gone without a
word) holds that transaction's row and key locks for at most 5 s after its last
statement; the server then ends its session and the transaction rolls back. Without
it, recovery and dependency resolution in every other worker waited on those locks
for as long as the freeze lasted. The worker's transactions send their statements
back to back, so only a stalled client reaches the bound, and what it rolls back is
recovered (a claim's jobs by their lease, a verdict by the check of the journal that
follows a lost answer)."""

CLAIM_SESSION = (NO_JIT, GENERIC_PLAN, *INDEX_SCANS, SORTS)
"""The settings of the claim. Its connection runs little else: the worker's
verdicts go on another, so the session stays in this mode between wake-ups, and
a statement that wants custom plans there (a sweep every few seconds) switches it
with one round trip each way."""

FAIR_CLAIM_SESSION = (NO_JIT, GENERIC_PLAN, *INDEX_SCANS, NO_SORTS)
"""The settings of the claim when a fair kind may be claimed (`NO_SORTS`)."""


@dataclasses.dataclass
class _Link:
    """What is known of the server session behind one psycopg connection."""

    pooled: bool | None = None
    """Whether a pooler stands between; None until a statement needs to know."""
    applied: dict[str, str] = dataclasses.field(default_factory=dict)
    """The value of each setting run on the session so far (never behind a pooler)."""
    used: bool = False
    """Whether a statement ran on it while `pooled` was still unknown."""


_links: weakref.WeakKeyDictionary[Any, _Link] = weakref.WeakKeyDictionary()


def fetch(
    alias: str, sql: str, params: Params, *, session: Sequence[Setting] = ()
) -> list[tuple[Any, ...]]:
    """Run one statement on `alias` and return its rows (none for a statement without).

    `session`: settings to run on the connection first, when it is outside a
    transaction (a SET inside one would roll back with it), unless they already
    hold there (a setting another statement changed is run again). Until they
    have, the statement is not prepared: an unnamed statement is planned for its
    values on every call, whatever the session's `plan_cache_mode`. Behind a
    pooler they hold for this statement's transaction only, every time.
    """
    connection = connections[alias]
    if not _prepared_path(connection):
        prime_session(alias, session)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
    return _fetch_prepared(connection, sql, params, session)


def _prepared_path(connection: Any) -> bool:
    """Whether our statements go prepared on `connection`: PostgreSQL, preparing not
    turned off, and no wrapper installed with `execute_wrapper()` (which must see
    every query, so those go through Django's cursor)."""
    return bool(
        connection.vendor == "postgresql"
        and venturi_settings.PREPARED_STATEMENTS
        and not connection.execute_wrappers
    )


def _checked(connection: Any) -> float:
    """Connect if need be and make Django's checks of a cursor; when the statement starts."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    return time.monotonic()


def _fetch_prepared(
    connection: Any, sql: str, params: Params, session: Sequence[Setting]
) -> list[tuple[Any, ...]]:
    started = _checked(connection)
    with connection.wrap_database_errors:
        raw = connection.connection
        link = _link(raw)
        if link.pooled is None and not session and not link.used:
            # A connection's first plain statement runs unnamed: one that makes a
            # single enqueue (a web request, CONN_MAX_AGE = 0) never pays the round
            # trip of finding out whether a pooler stands between.
            link.used = True
            rows = _execute(raw, sql, params, prepare=False)
        elif _pooled(raw, link):
            rows = _fetch_pooled(raw, sql, params, session)
        else:
            prepare = _set_session(raw, link, session) and _ready_to_prepare(raw)
            rows = _execute(raw, sql, params, prepare=prepare)
    if connection.queries_logged:
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return rows


Statement = tuple[str, Params]


def fetch_pair(
    alias: str, first: Statement, second: Statement, *, session: Sequence[Setting] = ()
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Run two statements in one transaction, the second once the first has ended (its
    snapshot sees what the first waited for), and return the rows of each.

    On the prepared path they go in one pipeline with one Sync: one round trip.
    Each round trip of a worker's claim loop costs more than the network's time:
    the thread waits for the interpreter's lock after it, behind the handlers'
    threads. Elsewhere they run one after the other in a transaction.
    """
    import psycopg

    connection = connections[alias]
    if not _prepared_path(connection) or not psycopg.Pipeline.is_supported():
        from django.db import transaction

        prime_session(alias, session)
        with transaction.atomic(using=alias):
            return fetch(alias, *first), fetch(alias, *second)
    started = _checked(connection)
    with connection.wrap_database_errors:
        raw = connection.connection
        link = _link(raw)
        pooled = _pooled(raw, link)
        prepare = not pooled and _set_session(raw, link, session) and _ready_to_prepare(raw)
        with psycopg.Cursor(raw) as head, psycopg.Cursor(raw) as tail:
            with raw.pipeline():
                if pooled and session:  # for this transaction only, as `_fetch_pooled`
                    raw.execute(_set_config(tuple(session), local=True), prepare=False)
                head.execute(_binary_arrays(first[0]), first[1], prepare=prepare, binary=True)
                tail.execute(_binary_arrays(second[0]), second[1], prepare=prepare, binary=True)
            rows = _rows(head), _rows(tail)
    if connection.queries_logged:
        lasted = f"{time.monotonic() - started:.3f}"
        connection.queries_log.extend({"sql": sql, "time": lasted} for sql, _ in (first, second))
    return rows


def _execute(raw: Any, sql: str, params: Params, *, prepare: bool) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.Cursor(raw) as cursor:
        cursor.execute(_binary_arrays(sql), params, prepare=prepare, binary=True)
        return _rows(cursor)


def _rows(cursor: Any) -> list[tuple[Any, ...]]:
    """The statement's rows; none for a statement that returns none. (Asking
    `cursor.description` builds a column object per column: 11 us for the claim's.)"""
    from psycopg.pq import ExecStatus

    result = cursor.pgresult
    if result is None or result.status != ExecStatus.TUPLES_OK:
        return []
    return cursor.fetchall()  # type: ignore[no-any-return]


def _fetch_pooled(
    raw: Any, sql: str, params: Params, session: Sequence[Setting]
) -> list[tuple[Any, ...]]:
    """Behind a pooler: unnamed, `session` set for this statement's transaction only.

    `set_config(..., true)` and the statement go in one pipeline with one Sync:
    one round trip and one transaction (the implicit one of the extended protocol
    in autocommit, else the caller's), which a transaction-mode pooler runs on one
    server connection. The settings end with that transaction and reach no other
    client. Without pipelines (libpq before 14) the settings are left out.
    """
    import psycopg

    if not session or not psycopg.Pipeline.is_supported():
        return _execute(raw, sql, params, prepare=False)
    with psycopg.Cursor(raw) as cursor:
        with raw.pipeline():
            raw.execute(_set_config(tuple(session), local=True), prepare=False)
            cursor.execute(_binary_arrays(sql), params, prepare=False, binary=True)
        return _rows(cursor)


@functools.lru_cache(maxsize=32)
def _set_config(settings: tuple[Setting, ...], *, local: bool) -> str:
    """One statement that sets `settings` for the session, or (`local`) for the
    current transaction only."""
    scope = "true" if local else "false"
    calls = ", ".join(f"set_config('{name}', '{value}', {scope})" for name, value in settings)
    return f"SELECT {calls}"


_ARRAY_PARAMETER = re.compile(r"%(\([^)]+\))?s(::\w+\[\])")


@functools.lru_cache(maxsize=64)
def _binary_arrays(sql: str) -> str:
    """`sql` as sent: compact, its array parameters (`%(name)s::text[]`) in binary (`%(name)b`).

    In text, psycopg quotes each element of an array with a regular expression
    (escaping the JSON of a result or a traceback), which was a fifth of a
    worker's CPU time; in binary the elements go as they are. Django's own
    cursors, on the unprepared path, bind on the client and take `%s` only.
    """
    return _ARRAY_PARAMETER.sub(r"%\1b\2", _compact(sql))


def _compact(sql: str) -> str:
    """`sql` without its comments, indentation and blank lines.

    psycopg remembers how it split a statement into text and parameters only
    for statements of at most 4,096 characters; a longer one (the claim, with
    its comments) is split again on every call.
    """
    lines = (_without_comment(line).strip() for line in sql.splitlines())
    return "\n".join(line for line in lines if line)


def _without_comment(line: str) -> str:
    """`line` up to a `--` comment that starts outside a quoted string."""
    start = line.find("--")
    while start >= 0 and line.count("'", 0, start) % 2:
        start = line.find("--", start + 2)
    return line if start < 0 else line[:start]


def _usable(raw: Any) -> bool:
    """Whether a statement can run on `raw` now: open, and not in a failed transaction."""
    from psycopg.pq import TransactionStatus

    status = raw.info.transaction_status
    return not raw.closed and status in (TransactionStatus.IDLE, TransactionStatus.INTRANS)


def _outside_transaction(raw: Any) -> bool:
    from psycopg.pq import TransactionStatus

    return bool(raw.autocommit) and raw.info.transaction_status == TransactionStatus.IDLE


def _link(raw: Any) -> _Link:
    link = _links.get(raw)
    if link is None:
        link = _links[raw] = _Link()
    return link


def behind_pooler(alias: str) -> bool:
    """Whether `alias` reaches PostgreSQL through a connection pooler (False elsewhere)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return False
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = connection.connection
        return _pooled(raw, _link(raw))


def _pooled(raw: Any, link: _Link) -> bool:
    if link.pooled is None:
        link.pooled = _behind_pooler(raw)
    return link.pooled


def _behind_pooler(raw: Any) -> bool:
    """Whether a connection pooler answers for PostgreSQL on this connection.

    At connect, PostgreSQL tells the client its backend's process id (with the
    key to cancel its queries). A pooler answers the connect itself, before it
    gives the client any server connection, so the id it tells is its own
    invention (PgBouncer's is random) and not the backend's that runs our
    statements. A plain TCP proxy or tunnel passes PostgreSQL's through, and
    keeps the session: it is not a pooler here either.
    """
    row = raw.execute("SELECT pg_backend_pid()", prepare=False).fetchone()
    return row is None or row[0] != raw.info.backend_pid


def prime_session(alias: str, session: Sequence[Setting]) -> None:
    """Run `session`'s settings on `alias` now, if it is outside a transaction.

    `fetch(session=...)` does it itself; a caller about to open a transaction
    and run `fetch(session=...)` in it calls this first. Behind a pooler it does
    nothing: there `fetch` sets them in the statement's own transaction.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql" or not session:
        return
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = connection.connection
        link = _link(raw)
        if not _pooled(raw, link):
            _set_session(raw, link, session)


@contextmanager
def own_transactions_bounded(alias: str) -> Iterator[None]:
    """Within the block, this thread's connection to `alias` runs with
    `OWN_TRANSACTIONS_BOUNDED`: an open connection is set now (once per connection), one
    the block opens is set as it connects. So the bound costs no round trip of its own:
    a step that never reaches the database does not connect for it."""
    if connections[alias].connection is not None:
        prime_session(alias, (OWN_TRANSACTIONS_BOUNDED,))
    outer = getattr(_bounding, "alias", None)
    _bounding.alias = alias
    try:
        yield
    finally:
        _bounding.alias = outer


_bounding = threading.local()
"""The alias whose new connections `own_transactions_bounded` sets, per thread."""


def _bound_as_it_connects(sender: object, connection: Any, **kwargs: object) -> None:
    if getattr(_bounding, "alias", None) == connection.alias:
        prime_session(connection.alias, (OWN_TRANSACTIONS_BOUNDED,))


connection_created.connect(_bound_as_it_connects, dispatch_uid="venturi-own-transactions")


def reset_planner(alias: str) -> None:
    """Give the session of `alias` PostgreSQL's own planner settings back, where our
    statements changed them (`testing.drain`: the test's own queries run after it)."""
    connection = connections[alias]
    raw = connection.connection if connection.vendor == "postgresql" else None
    link = None if raw is None else _links.get(raw)
    if raw is None or link is None or link.pooled or not _usable(raw):
        return  # nothing of ours to undo, or nothing can run (and an error is on its way)
    changed = sorted(name for name in link.applied if name in _PLANNER_NAMES)
    if changed:
        with connection.wrap_database_errors:
            raw.execute(_RESET_PLANNER, [changed], prepare=False)
        for name in changed:
            del link.applied[name]


_PLANNER_NAMES = frozenset(name for name, _ in (CUSTOM_PLANS, *INDEX_SCANS, NO_SORTS))
_RESET_PLANNER = "SELECT set_config(name, reset_val, false) FROM pg_settings WHERE name = ANY(%s)"


def _set_session(raw: Any, link: _Link, session: Sequence[Setting]) -> bool:
    """Run the settings of `session` that do not hold on `raw` (in one statement);
    True once all hold. On a connection where the project prepares its own
    statements, those of FOR_PREPARED are left out: they would reach only its own."""
    if _project_prepares(raw):
        session = [setting for setting in session if setting not in FOR_PREPARED]
    changes = tuple((name, value) for name, value in session if link.applied.get(name) != value)
    if not changes:
        return True
    if not _outside_transaction(raw):
        return False
    raw.execute(_set_config(changes, local=False), prepare=False)
    link.applied.update(changes)
    return True


def _ready_to_prepare(raw: Any) -> bool:
    """Set the connection up for our prepared statements once; False if it cannot be.

    A connection whose `prepare_threshold` is still None (Django's default) gets
    a threshold that only explicit requests reach, so psycopg prepares our
    statements and never Django's. A connection set up otherwise by the project
    runs ours unnamed: server-side binding, custom plan, no prepare.
    """
    if _project_prepares(raw):
        return False
    if raw.prepare_threshold is None:
        raw.prepare_threshold = ONLY_WHEN_ASKED
    return True


def _project_prepares(raw: Any) -> bool:
    """Whether the project set the connection's `prepare_threshold` itself (neither
    Django's None nor ours)."""
    return raw.prepare_threshold not in (None, ONLY_WHEN_ASKED)
