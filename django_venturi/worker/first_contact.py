"""Before a worker starts its threads, its database must answer.

A worker pointed at a missing database, a wrong port or an unknown host used to
start its services, log "lost the database ... retrying" once, and wait forever,
looking active. Now it tries the database first, from the main thread:

- a `--burst` worker that cannot reach it stops at once (`DatabaseUnreachable`:
  the command exits non-zero) with a message naming the database, host and port
  (never the password);
- a long-running worker says the same every UNREACHABLE_REPEAT seconds while it
  tries again, tells systemd what it waits for, and is not ready (no `READY=1`)
  until the database answers.

First it bounds the waits of the worker's connections (`store.connections.bound_waits`,
on the jobs alias and the listener's), so that each try gives up after the alias's
`connect_timeout`, and no connection of the worker is left waiting on a dead peer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from django.db import connections

from django_venturi.store.connections import DATABASE_ERRORS, bound_waits
from django_venturi.worker import systemd
from django_venturi.worker.listener import listener_alias

logger = logging.getLogger("django_venturi.worker")

UNREACHABLE_REPEAT = 30.0
"""A worker waiting for its database says so again after this many seconds."""
RETRY_DELAYS = (0.5, 1.0, 2.0, 5.0)
"""Waits between tries, growing while the database stays away."""


class DatabaseUnreachable(RuntimeError):
    """A burst worker's database does not answer: it stops before it starts."""


def where(alias: str) -> str:
    """The database an alias names, its host and port, for a message (no password)."""
    settings_dict = connections.settings[alias]
    name = settings_dict.get("NAME") or "(no NAME)"
    if connections[alias].vendor == "sqlite":
        return f"database {str(name)!r} (alias {alias!r})"
    host, port = settings_dict.get("HOST"), settings_dict.get("PORT")
    if host:
        place = f"{host}:{port}" if port else f"{host} (default port)"
    else:
        place = "the default socket" + (f", port {port}" if port else "")
    return f"database {str(name)!r} on {place} (alias {alias!r})"


def try_database(alias: str) -> Exception | None:
    """Connect and make one round trip; the error if that failed (the connection closed)."""
    connection = connections[alias]
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DATABASE_ERRORS as error:
        with contextlib.suppress(*DATABASE_ERRORS):
            connection.close()
        return error
    return None


def unreachable_message(alias: str, error: Exception) -> str:
    """What a worker says of a database it cannot reach: where, and the driver's reason."""
    reason = " ".join(str(error).split()) or type(error).__name__
    password = connections.settings[alias].get("PASSWORD")
    if password:
        reason = reason.replace(str(password), "***")
    return f"cannot reach {where(alias)}: {reason}"


def wait_for_database(alias: str, *, worker: str, burst: bool, stop: threading.Event) -> bool:
    """Return once the database answers (True), or when `stop` is set first (False).

    Raises `DatabaseUnreachable` for a burst worker whose database does not answer."""
    for each in {alias, listener_alias(alias)}:
        bound_waits(each)
    error = try_database(alias)
    if error is None:
        return True
    message = unreachable_message(alias, error)
    if burst:
        raise DatabaseUnreachable(message)
    began = said = time.monotonic()
    logger.error(
        "worker %s %s; trying again, not ready until it answers",
        worker,
        message,
        extra={"worker": worker},
    )
    systemd.status(f"waiting for {where(alias)}")
    tries = 0
    while not stop.wait(RETRY_DELAYS[min(tries, len(RETRY_DELAYS) - 1)]):
        tries += 1
        error = try_database(alias)
        if error is None:
            logger.warning(
                "worker %s reached %s after %.1f s",
                worker,
                where(alias),
                time.monotonic() - began,
                extra={"worker": worker},
            )
            return True
        if time.monotonic() - said >= UNREACHABLE_REPEAT:
            said = time.monotonic()
            logger.error(
                "worker %s still %s (for %.0f s); trying again, not ready",
                worker,
                unreachable_message(alias, error),
                said - began,
                extra={"worker": worker},
            )
    return False
