"""Database connections of threads that no request cycle cleans up.

Django closes a broken or obsolete connection at the start and end of each
request (`close_old_connections`). A worker's threads have no requests: the
handler threads keep theirs from job to job (`JobConnections`), the main thread
closes its own after a failure, and this module does the same for the threads
of `sync_to_async`, where the ORM calls of `async def` handlers run. Without it,
a connection broken by a database restart would stay broken in such a thread,
failing every run there.

It also gives the parameters of a direct psycopg connection to an alias
(`connection_params`), which the listener and the sweeper open outside Django,
and the bounded waits (`bound_waits`: TCP keepalives, `tcp_user_timeout`, a
connect timeout) that a worker gives its aliases unless their OPTIONS say otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import select
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from django import db
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

DATABASE_ERRORS = (db.OperationalError, db.InterfaceError)
"""What a database that went away raises."""

REFUSING_WRITES = frozenset({"25006", "57P01", "57P02", "57P03"})
"""SQLSTATEs of a server that takes no writes now, whatever the statement: a read-only
transaction (a demoted primary after a failover, a hot standby, or
`default_transaction_read_only`), and a server shutting down or starting up."""

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


IDLE_CHECK_AFTER = 30.0
"""A handler thread's kept connection unused this many seconds is checked (one round
trip) before the next job: a server, a proxy or a firewall may have dropped it."""


class JobConnections:
    """The connections of one handler thread, kept from job to job.

    Django closes a connection at the end of each request once `CONN_MAX_AGE`
    has passed, and `CONN_MAX_AGE = 0` (its default) means one connection per
    request. A worker is not a request cycle: a new connection per job would
    cost a connection (and a backend process) per job. So in a worker's handler
    threads `CONN_MAX_AGE = 0` keeps the connection for the life of the thread;
    a positive `CONN_MAX_AGE` still closes it once that old, and `None` never.
    Whatever the setting, a connection is closed after a job that left it
    unusable (an error and a failed check) or with autocommit changed, and one
    left unused for IDLE_CHECK_AFTER seconds is checked before the next job.
    """

    def __init__(self) -> None:
        self._last_used = time.monotonic()
        self._wrappers = _wrappers_of_this_thread()
        """This thread's connection wrappers, one per alias, made when the thread starts
        (making one may import a database backend: never in the middle of a run). A
        thread keeps its wrapper of an alias for its life; looking them up again per
        job (`connections.all()`) cost a fifth of a handler thread's time on tiny jobs."""

    def before_job(self) -> None:
        if time.monotonic() - self._last_used >= IDLE_CHECK_AFTER:
            self._tidy()  # a positive CONN_MAX_AGE may have passed while idle
            close_broken_connections()
            return
        for wrapper in self._open():
            if _closed_by_server(wrapper.connection):
                wrapper.close()

    def after_job(self) -> None:
        self._tidy()
        self._last_used = time.monotonic()

    def _open(self) -> list[BaseDatabaseWrapper]:
        """The wrappers of this thread that hold a connection."""
        return [wrapper for wrapper in self._wrappers if wrapper.connection is not None]

    def _tidy(self) -> None:
        """Django's end-of-request step, with CONN_MAX_AGE = 0 read as "keep", and a
        connection that had an error closed if its server no longer takes writes."""
        for wrapper in self._open():
            if wrapper.settings_dict.get("CONN_MAX_AGE") == 0:
                wrapper.close_at = None
            if wrapper.errors_occurred and _read_only_now(wrapper):
                wrapper.close()
                continue
            wrapper.close_if_unusable_or_obsolete()


def _read_only_now(wrapper: BaseDatabaseWrapper) -> bool:
    """After an error on this connection: is its server one that refuses writes (a
    demoted primary after a failover, a standby)? Django would keep it, since it still
    answers `SELECT 1`, and every job of this thread would fail on it until a restart;
    closed, the next job reconnects and follows the failover."""
    if wrapper.vendor != "postgresql" or wrapper.in_atomic_block:
        return False
    try:
        return not _accepts_writes(wrapper)
    except db.DatabaseError:
        return False  # unusable: Django's own check closes it


def _wrappers_of_this_thread() -> list[BaseDatabaseWrapper]:
    """A wrapper of each alias for the calling thread, but of those whose backend this
    process cannot load (an alias the project never uses here: nor will its jobs)."""
    wrappers = []
    for alias in connections:
        try:
            wrappers.append(connections[alias])
        except ImproperlyConfigured:  # its database driver is not installed here
            continue
    return wrappers


def _closed_by_server(raw: object) -> bool:
    """Whether an idle client connection has something to read: the server closed it
    (a restart, `pg_terminate_backend`, an idle timeout). No round trip: one poll of
    its socket. A connection without a socket (SQLite) never is."""
    try:
        fileno = raw.fileno()  # type: ignore[attr-defined]
        readable, _, _ = select.select([fileno], [], [], 0)
    except (AttributeError, OSError, ValueError, TypeError):
        return False
    return bool(readable)


def refuses_writes(error: BaseException) -> bool:
    """Whether `error` is the server refusing every write for now (`REFUSING_WRITES`), not
    the statement: a database error whose cause carries one of those SQLSTATEs."""
    if not isinstance(error, db.DatabaseError):
        return False
    return getattr(error.__cause__, "sqlstate", None) in REFUSING_WRITES


def unavailable(error: BaseException) -> bool:
    """Whether `error` may be the database's state rather than the statement's fault: a
    lost connection, a deadlock or lock timeout, or a server refusing writes. Such a
    write is kept and tried again; it is never turned into a failed run."""
    return isinstance(error, DATABASE_ERRORS) or refuses_writes(error)


def reachable(alias: str) -> bool:
    """Whether this thread reaches the database and may write there (connecting, then a
    round trip); if not, its connection is closed so that the next try reconnects, and
    follows a failover to wherever the address now leads.

    On PostgreSQL a server in recovery (a standby) or whose transactions are read-only
    (a demoted primary) is not reachable: every write there would be refused."""
    connection = connections[alias]
    with contextlib.suppress(db.DatabaseError):
        connection.ensure_connection()
        if connection.vendor != "postgresql":
            if connection.is_usable():
                return True
        elif _accepts_writes(connection):
            return True
    with contextlib.suppress(*DATABASE_ERRORS):
        connection.close()
    return False


_ACCEPTS_WRITES_SQL = (
    "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'"
)


def _accepts_writes(connection: BaseDatabaseWrapper) -> bool:
    """One round trip: whether a PostgreSQL session's transactions may write."""
    with connection.cursor() as cursor:
        cursor.execute(_ACCEPTS_WRITES_SQL)
        row = cursor.fetchone()
    return bool(row and row[0])


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


def connection_params(alias: str) -> dict[str, Any]:
    """psycopg connection parameters of a Django database alias."""
    params = connections[alias].get_connection_params()
    return {
        key: value
        for key, value in params.items()
        if key not in {"cursor_factory", "context", "prepare_threshold", "server_side_binding"}
    }


BOUNDED_WAITS: dict[str, int] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""libpq options a worker's PostgreSQL connections get unless the alias's OPTIONS set
them: a connection attempt gives up after 10 s, and a connection whose peer went
silent without a reset (a NAT or firewall timeout, a lost host) is noticed within
about 30 s (keepalive probes from 10 s idle, then every 5 s; unacknowledged data
for 30 s), instead of the kernel's defaults (two hours of idle, then about 15
minutes of retransmissions). `tcp_user_timeout` is in milliseconds (libpq 12+)."""
TCP_USER_TIMEOUT_LIBPQ = 120000
"""The first libpq version that knows `tcp_user_timeout`."""


def bound_waits(alias: str) -> None:
    """Give the PostgreSQL alias's connections `BOUNDED_WAITS`, below its own OPTIONS.

    For the whole process, from its next connection on: the worker calls it for its
    aliases before its threads connect."""
    if connections[alias].vendor != "postgresql":
        return
    options = connections.settings[alias].setdefault("OPTIONS", {})
    for name, value in bounded_waits().items():
        options.setdefault(name, value)


def bounded_waits() -> dict[str, int]:
    """`BOUNDED_WAITS`, without what this process's libpq does not know."""
    from psycopg import pq

    if pq.version() >= TCP_USER_TIMEOUT_LIBPQ:
        return dict(BOUNDED_WAITS)
    return {name: value for name, value in BOUNDED_WAITS.items() if name != "tcp_user_timeout"}
