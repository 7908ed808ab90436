"""Retry now: a failed or ready job becomes ready with `run_at` = now (the admin's action).

A failed job starts a fresh set of attempts: its `failures` count goes back to 0,
so `max_attempts` counts again from the retry (and a later give-up says "gave up
after 3 failed attempts (max_attempts=3)", which is then true). Its `attempt`
(runs started) and its journal keep the whole history. `give_up_after` still
counts from the first enqueue, so a job that gave up by age gets one run.

A failed job with a dedup key cannot become ready while another ready job
holds its kind and key (the dedup rule: one ready job per kind and key); such a
job is reported as a clash and left failed. On PostgreSQL the job's queue is
notified so an idle worker wakes.

Errors: the database's errors as they are (`django.db.DatabaseError`), and then
nothing is retried. Only the unique-index violation of a dedup clash is caught
(and reported in `clashes`): any other `IntegrityError`, such as a check or a
trigger of the project's own, propagates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from django.db import IntegrityError, transaction

from django_venturi.conf import venturi_settings
from django_venturi.states import State
from django_venturi.store.clock import now_expression
from django_venturi.store.notify import wake_workers

RETRYABLE_STATES = (State.READY, State.FAILED)
_AGAIN = {"state": State.READY, "finished_at": None, "cancel_requested_at": None, "failures": 0}
"""What a failed job's row becomes (with `run_at` = now)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RetryResult:
    """What a retry did."""

    retried: list[int]
    """Jobs now ready and due."""
    clashes: list[int]
    """Failed jobs left failed: another ready job holds their kind and dedup key."""
    skipped: list[int]
    """Jobs in another state (running, completed, cancelled) or gone: left as they are."""


def retry_now(job_ids: Iterable[int], *, using: str | None = None) -> RetryResult:
    """Make the given ready or failed jobs due at once; report clashes and skipped jobs."""
    from django_venturi.models import (  # at call time: importing the package must not load models
        Job,
    )

    alias = using or venturi_settings.DATABASE
    ids = sorted(set(job_ids))
    jobs = Job.objects.using(alias)
    retried: list[int] = []
    clashes: list[int] = []
    with transaction.atomic(using=alias):
        rows = list(
            jobs.filter(id__in=ids, state__in=RETRYABLE_STATES)
            .select_for_update()
            .order_by("id")
            .values_list("id", "state", "queue", "kind", "dedup_key")
        )
        now = now_expression(alias)
        ready = [job_id for job_id, state, *_ in rows if state == State.READY]
        jobs.filter(id__in=ready).update(run_at=now)
        retried.extend(ready)
        # Without a dedup key no ready job can clash: those are one statement.
        unkeyed = [row[0] for row in rows if row[1] == State.FAILED and row[4] is None]
        jobs.filter(id__in=unkeyed, state=State.FAILED).update(**_AGAIN, run_at=now)
        retried.extend(unkeyed)
        for job_id, state, _, kind, key in rows:
            if state != State.FAILED or key is None:
                continue
            try:
                with transaction.atomic(using=alias):  # a savepoint: a clash undoes this job only
                    jobs.filter(id=job_id, state=State.FAILED).update(**_AGAIN, run_at=now)
            except IntegrityError:
                # The dedup index refused it if a ready job of its key is there now (the
                # statement waited for the other transaction); anything else is not ours.
                twin = jobs.filter(kind=kind, dedup_key=key, state=State.READY)
                if not twin.exists():
                    raise
                clashes.append(job_id)
            else:
                retried.append(job_id)
        retried_ids = set(retried)
        queues = sorted({queue for job_id, _, queue, *_ in rows if job_id in retried_ids})
        wake_workers(alias, queues)
    done = set(retried) | set(clashes)
    return RetryResult(
        retried=sorted(retried),
        clashes=clashes,
        skipped=[job_id for job_id in ids if job_id not in done],
    )
