"""Retention run by workers: delete finished jobs older than `VENTURI["RETENTION"]` says.

Every worker runs a sweeper thread when the setting is given, but one sweep runs
at a time: on PostgreSQL a sweep first takes an advisory lock with
`pg_try_advisory_xact_lock` and skips its turn if another worker holds it. SQLite
has one writer at a time anyway, so there the sweep simply runs. The deletion
itself is `venturi.cleanup()`: small batches, each its own short transaction.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta

from django.db import connections

from django_venturi.conf import venturi_settings
from django_venturi.store.connections import connection_params
from django_venturi.store.maintenance_lock import cleanup_turn
from django_venturi.store.retention import CleanupResult, cleanup
from django_venturi.worker.chores import PeriodicChore

logger = logging.getLogger("django_venturi.retention")

SWEEP_INTERVAL = timedelta(minutes=10)
"""How often each worker offers to sweep (the first sweep comes soon after it starts)."""
FIRST_SWEEP_AFTER = timedelta(seconds=5)
ADVISORY_LOCK_KEY = 0x76656E7475726902
"""The advisory lock id of retention sweeps (b"venturi" and 2): one sweep at a time.

Not the claim's caps lock (b"venturi" and 1): sharing it made a sweep skip its
turn whenever a claim of a capped kind happened to hold that lock."""


def sweep(alias: str) -> dict[str, CleanupResult] | None:
    """Delete what `RETENTION` no longer keeps; None if another process is sweeping."""
    policy = venturi_settings.RETENTION
    if not policy:
        return {}
    if connections[alias].vendor != "postgresql":
        return _delete(alias, policy)
    # The cleanup's turn first, outside the sweep lock's transaction: a sweep that
    # waited for a maintenance run inside it would make the rebuild wait for it.
    with cleanup_turn(alias), _sweep_lock(alias) as taken:
        return _delete(alias, policy) if taken else None


@contextlib.contextmanager
def _sweep_lock(alias: str) -> Iterator[bool]:
    """Hold the sweep's lock for the block, if it is free; yield whether it was.

    The lock lives in a transaction of a connection of its own, open while the
    batches run on the thread's connection. A session lock would not do behind
    a transaction-mode pooler: its unlock may reach another server connection
    and leave it held on one that other clients then use, while an open
    transaction keeps its server connection. Taking a lock takes no snapshot and
    no transaction id: the open transaction holds back no vacuum. Its errors are
    Django's, as those of the sweep's own statements.
    """
    import psycopg

    with (
        connections[alias].wrap_database_errors,
        psycopg.connect(**connection_params(alias), autocommit=False) as holder,
    ):
        row = holder.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY]).fetchone()
        yield bool(row and row[0])


def _delete(alias: str, policy: dict[str, timedelta]) -> dict[str, CleanupResult]:
    results = {}
    for state, older_than in sorted(policy.items()):
        results[state] = result = cleanup(older_than=older_than, states=[state], using=alias)
        if result.jobs or result.workers:
            logger.info(
                "retention: deleted %s (%s, finished more than %s ago)",
                result.counts(),
                state,
                older_than,
                extra={"state": state, "jobs": result.jobs, "batches": result.batches},
            )
    return results


class Sweeper(PeriodicChore):
    """A daemon thread of a worker that sweeps every `interval` until `stop` is set."""

    thread_name = "venturi-retention"
    first_after = FIRST_SWEEP_AFTER
    logger = logger
    failure = "retention sweep failed: %s; next turn in %s"

    def __init__(
        self, *, alias: str, stop: threading.Event, interval: timedelta = SWEEP_INTERVAL
    ) -> None:
        super().__init__(alias=alias, stop=stop, interval=interval)

    @classmethod
    def start_if_configured(cls, *, alias: str, stop: threading.Event) -> Sweeper | None:
        if not venturi_settings.RETENTION:
            return None
        chore = cls(alias=alias, stop=stop)
        chore.thread.start()
        return chore

    def run_pass(self) -> object:
        return sweep(self.alias)
