"""`venturi.cancel()`: a ready job is cancelled at once; a running one is asked to stop.

One locking read decides. The given jobs are read and locked in one statement
(`SELECT ... FOR NO KEY UPDATE`, in id order, whatever their state), and each
is judged by the state it has under that lock:

- ready or waiting: it becomes `cancelled` at once, in the caller's
  transaction, and so do the jobs waiting for it (see `dependencies.py`);
- running: it gets `cancel_requested_at` set, and on PostgreSQL a
  notification on the cancel channel tells its worker right away (other
  databases: the worker sees the request at its next heartbeat). Its handler
  then sees `ctx.should_stop`; when it returns, the job ends `cancelled` and its
  journal entry says so;
- finished: it is left as it is;
- an id with no job (never enqueued, or deleted) is counted as unknown.

Why the lock makes a cancel impossible to lose: every move of a running job
back to `ready` (a paused, retry, timeout or released verdict, a lease
recovery) is an update fenced on `state = 'running'` (`completion.py`).
A verdict that holds the row when the cancel reads it makes the read wait, and
the cancel then sees the job `ready` and cancels it. A verdict that comes after
the read waits for the cancel's transaction, and sees `cancel_requested_at`:
it cancels the job instead of requeueing it. SQLite runs one writer at a time
(IMMEDIATE transactions), so the read and the writes are never interleaved.

Errors: the database's errors as they are (`django.db.DatabaseError`); a
deadlock (a worker's verdict batch locks its rows in its own order) is retried
a few times first, in a savepoint. `TypeError` or `ValueError` for something
that is not a job or a job id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from django.db import connections

from django_venturi.conf import CANCEL_CHANNEL_SUFFIX, venturi_settings
from django_venturi.states import State
from django_venturi.store import dependencies
from django_venturi.store.clock import now_expression
from django_venturi.store.deadlocks import retrying_deadlocks

if TYPE_CHECKING:
    from django_venturi.models import Job


NOTIFY_IDS_PER_PAYLOAD = 400
UNCLAIMED_STATES = (State.READY, State.WAITING)


@dataclasses.dataclass(frozen=True, slots=True)
class CancelResult:
    """What a cancel did: each distinct job id given is counted in exactly one field."""

    cancelled: int
    """Ready and waiting jobs now `cancelled` (not counting their dependents)."""
    stopping: int
    """Running jobs asked to stop (by this cancel or an earlier one); they end `cancelled`
    when their handler returns."""
    already_finished: int = 0
    """Jobs that had finished (`completed`, `failed`, `cancelled`): left as they are."""
    unknown: int = 0
    """Ids with no job: never enqueued, or deleted (cleanup)."""


def cancel_channel() -> str:
    """The PostgreSQL channel that carries cancel requests to workers."""
    return venturi_settings.NOTIFY_CHANNEL + CANCEL_CHANNEL_SUFFIX


def cancel(jobs: Job | int | Iterable[Job | int], *, using: str | None = None) -> CancelResult:
    """Cancel jobs by row or id, inside the caller's transaction if there is one.

    Jobs enqueued after a cancelled job are cancelled too, unless enqueued with
    `after_failure="run"`.
    """
    ids = sorted(set(_ids(jobs)))
    alias = using or venturi_settings.DATABASE
    if not ids:
        return CancelResult(cancelled=0, stopping=0)
    # A cycle through the rows locked here in id order and a worker's verdict batch
    # locking them in its own: tried again in a savepoint (`deadlocks`).
    return retrying_deadlocks(alias, lambda: _cancel(alias, ids))


def _cancel(alias: str, ids: Sequence[int]) -> CancelResult:
    """The one locking read of `ids`, and what each job's locked state decides."""
    from django_venturi.models import (
        Job,
    )  # at call time: importing the package must not load models

    connection = connections[alias]
    jobs = Job.objects.using(alias)
    # NO KEY: the verdicts' journal rows (a foreign key to the job) need not wait.
    locked = jobs.select_for_update(no_key=connection.features.has_select_for_no_key_update)
    rows = list(
        locked.filter(id__in=ids)
        .order_by("id")
        .values_list("id", "state", "dependents", "cancel_requested_at")
    )
    now = now_expression(alias)
    unclaimed = [(job_id, count) for job_id, state, count, _ in rows if state in UNCLAIMED_STATES]
    running = [(job_id, asked) for job_id, state, _, asked in rows if state == State.RUNNING]
    if unclaimed:
        jobs.filter(id__in=[job_id for job_id, _ in unclaimed]).update(
            state=State.CANCELLED, finished_at=now, waiting_for=0
        )
        dependencies.resolve(alias, [job_id for job_id, count in unclaimed if count])
    newly_asked = [job_id for job_id, asked in running if asked is None]
    if newly_asked:
        jobs.filter(id__in=newly_asked).update(cancel_requested_at=now)
        _notify_workers(alias, newly_asked)
    return CancelResult(
        cancelled=len(unclaimed),
        stopping=len(running),
        already_finished=len(rows) - len(unclaimed) - len(running),
        unknown=len(ids) - len(rows),
    )


def _ids(jobs: Job | int | Iterable[Job | int]) -> list[int]:
    if isinstance(jobs, str | bytes):
        raise TypeError(
            f"cancel(jobs=...): expected a Job, a job id or an iterable of them, not {jobs!r}"
        )
    items = jobs if isinstance(jobs, Iterable) else [jobs]
    return [_id(item) for item in items]


def _id(item: object) -> int:
    from django_venturi.models import Job

    if isinstance(item, Job):
        if item.pk is None:
            raise ValueError(f"cancel(jobs=...): {item!r} has no id (it was never saved)")
        return int(item.pk)
    if isinstance(item, int) and not isinstance(item, bool):
        return item
    raise TypeError(
        f"cancel(jobs=...): expected a Job or a job id (int), got {type(item).__name__} {item!r}"
    )


def _notify_workers(alias: str, job_ids: list[int]) -> None:
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        # Delivered at commit, so a worker never looks before the request is visible.
        # A payload holds comma-separated ids, within PostgreSQL's 8,000-byte limit.
        for start in range(0, len(job_ids), NOTIFY_IDS_PER_PAYLOAD):
            chunk = job_ids[start : start + NOTIFY_IDS_PER_PAYLOAD]
            cursor.execute(
                "SELECT pg_notify(%s, %s)", [cancel_channel(), ",".join(map(str, chunk))]
            )
