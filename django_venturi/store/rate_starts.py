"""A rate-limited job's start, as its handler sees it.

The claim records each start of a limited kind at the claim's time
(`claim_statement.py`). The handler starts a little later: a few milliseconds,
or more on a starved CPU. Just before the handler runs, its worker moves the
start to that moment (`confirm`), so the window a later claim counts is the one
the handlers see. That is one statement per start of a limited kind, never for
other kinds.

The move must land before any claim could count the start out of its window at
the claim's time (`per` after it). A handler about to start later than half of
`per` after its claim (a worker frozen or starved for that long) is handed back
to the queue instead (`too_late`).
"""

from __future__ import annotations

import time

from django.db import connections, transaction
from django.utils import timezone

from django_venturi.models import RateStart
from django_venturi.store.claim import ClaimedJob
from django_venturi.store.rate_limits import RateLimit

_CONFIRM_SQL = """
UPDATE {ledger} SET started_at = greatest(started_at, clock_timestamp())
WHERE id = (SELECT max(id) FROM {ledger} WHERE job_id = %s)
"""


def too_late(limit: RateLimit, job: ClaimedJob, now: float) -> bool:
    """Whether a handler starting at `now` (monotonic) is too late to move its start."""
    return now - job.claim_sent > limit.per.total_seconds() / 2


def confirm(alias: str, job: ClaimedJob, limit: RateLimit) -> bool:
    """Move the job's latest recorded start to now (its handler starts); False, moving
    nothing, if it is too late for that (`too_late`: its handler must not run)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return _confirm_holding_the_write_lock(alias, job, limit)
    if too_late(limit, job, time.monotonic()):
        return False
    ledger = connection.ops.quote_name(RateStart._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(_CONFIRM_SQL.format(ledger=ledger), [job.id])
    return True


def _confirm_holding_the_write_lock(alias: str, job: ClaimedJob, limit: RateLimit) -> bool:
    """SQLite: the time is read once the transaction holds the write lock (IMMEDIATE).
    A write that waited for the lock could otherwise date the start before the
    handler's, or land after claims counted the claim's record out of its window: the
    lock's wait counts towards `too_late`."""
    with transaction.atomic(using=alias):
        if too_late(limit, job, time.monotonic()):
            return False
        latest = RateStart.objects.using(alias).filter(job_id=job.id).order_by("-id")[:1]
        RateStart.objects.using(alias).filter(
            id__in=list(latest.values_list("id", flat=True))
        ).update(started_at=timezone.now())
    return True
