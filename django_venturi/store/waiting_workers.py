"""Wake-ups without the commit lock: an enqueue NOTIFYs after its commit, and only
while a worker of its queue waits for one.

PostgreSQL takes one database-wide lock at the commit of every transaction that sent
a NOTIFY, and flushes that commit's WAL record while holding it: producers that
NOTIFY in their own transactions commit one at a time (measured in
`benchmarks/producers.py`: 16 producers reached about half the INSERTs per second
of the same INSERTs without it). So an enqueue's transaction sends none. After it
commits, one statement on the same connection looks for a waiting worker of the
job's queue and sends the NOTIFY only if there is one, in a transaction of its own
with an asynchronous commit (it protects nothing durable, so nothing waits for a
WAL flush while the lock is held). With no worker waiting, that statement reads a
few rows, takes no transaction id and no lock.

Each process remembers, for NOT_WAITING_MEMORY seconds, the queues that look found
no waiting worker of, and skips the look for them meanwhile: a producer enqueueing
while every worker is busy sends one statement per job, not two.

A worker marks itself waiting (`WorkerProcess.waiting`) when a claim came back short
with room left, then claims at once and again NOT_WAITING_MEMORY seconds later before
it sleeps; it clears the mark when a claim comes back full (it is behind, and claims
as its runs finish). No wake-up is lost: a job committed before the worker's first
claim after the mark began is claimed by it; one committed later, whose producer
looked after the mark, finds the mark and sends the NOTIFY; and one whose producer
skipped the look, remembering an older look that found nobody, was committed less
than NOT_WAITING_MEMORY after that look, so before the worker's second claim.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction

from django_venturi.conf import venturi_settings
from django_venturi.store.registration import stale_after

_WAKE_SQL = """
SELECT q.queue, pg_notify(%s, q.queue), set_config('synchronous_commit', 'off', true)
FROM unnest(%s::text[]) AS q(queue)
WHERE EXISTS (
    SELECT 1 FROM {table} AS w
    WHERE w.waiting AND w.stopped_at IS NULL AND w.heartbeat_at > now() - %s::interval
      AND (w.queues IS NULL OR w.queues ? q.queue)
)
"""
"""One NOTIFY per queue that a live, waiting worker serves (`queues` null: all); the
rows returned name the queues notified."""

NOT_WAITING_MEMORY = 0.25
"""Seconds a process remembers that no worker of a queue waits (and sends no look for
it); a worker claims again this long after it marked itself waiting."""

_not_waiting: dict[tuple[str, str], float] = {}
"""(alias, queue) -> when (`time.monotonic()`) a look found no waiting worker of it."""


def wake_after_commit(alias: str, queues: Iterable[str]) -> None:
    """After the caller's transaction commits (at once outside one), wake a waiting
    worker of each queue (PostgreSQL; elsewhere workers poll). A rolled-back
    transaction wakes nobody."""
    if connections[alias].vendor != "postgresql":
        return
    # What the process remembers is read at the commit, not now: a look remembered now
    # may be too old by the time a long transaction commits.
    transaction.on_commit(
        functools.partial(_committed, alias, sorted(set(queues))), using=alias, robust=True
    )


def _committed(alias: str, queues: list[str]) -> None:
    now = time.monotonic()
    chosen = [
        queue
        for queue in queues
        if now - _not_waiting.get((alias, queue), -NOT_WAITING_MEMORY) >= NOT_WAITING_MEMORY
    ]
    if chosen:  # else no worker of these queues waited a moment ago
        wake_waiting(alias, chosen)


def wake_waiting(alias: str, queues: list[str]) -> None:
    """NOTIFY the wake-up channel once per queue a waiting worker serves."""
    from django_venturi.models import WorkerProcess  # at call time, as registration does

    connection = connections[alias]
    table = connection.ops.quote_name(WorkerProcess._meta.db_table)
    params: list[Any] = [venturi_settings.NOTIFY_CHANNEL, queues, stale_after()]
    looked = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(_WAKE_SQL.format(table=table), params)
        notified = {row[0] for row in cursor.fetchall()}
    for queue in queues:
        if queue in notified:
            _not_waiting.pop((alias, queue), None)
        else:
            _not_waiting[(alias, queue)] = looked


def forget() -> None:
    """Forget which queues had no waiting worker (the next enqueue of each looks)."""
    _not_waiting.clear()


def mark(alias: str, worker: str, *, waiting: bool) -> bool:
    """Mark `worker` waiting for a wake-up (or not); False if its row is gone."""
    from django_venturi.models import WorkerProcess  # at call time, as registration does

    return WorkerProcess.objects.using(alias).filter(name=worker).update(waiting=waiting) > 0
