"""Running jobs inline, in the caller's thread: eager mode and the testing helpers.

`VENTURI["TESTING_EAGER"]` makes each enqueue run its job at once (`run_enqueued`),
and `django_venturi.testing.drain()` runs what is due; both claim, run and write
verdicts exactly as a worker does, in the caller's thread and transaction.

Nothing is imported from the models at import time: pytest may load the testing
helpers, and so this module, before Django is set up.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_venturi.models import Job
    from django_venturi.states import JournalOutcome, State
    from django_venturi.store.claim import ClaimedJob
    from django_venturi.store.verdicts import Verdict

INLINE_WORKER = "testing"
"""The worker name the journal shows for jobs run inline (eager mode, `drain()`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ran:
    """One run of one job by `drain()` or `eager()`."""

    job_id: int
    kind: str
    attempt: int
    outcome: JournalOutcome
    """What the journal says of this run."""
    state: State
    """The job's state after the run."""
    error: str = ""
    """`type: message` of the run's error, if any."""


def run_enqueued(jobs: Sequence[Job]) -> None:
    """Eager mode: run freshly enqueued jobs now, whatever their `run_at` (enqueue calls this)."""
    for job in jobs:
        _run_one(job._state.db or _alias(None), job.id)
        job.refresh_from_db(using=job._state.db)


def _run_one(alias: str, job_id: int) -> Ran | None:
    """Claim one given ready job (due or not) and run it; None if it is not ready."""
    from django.db import transaction
    from django.db.models import F

    from django_venturi.conf import venturi_settings
    from django_venturi.models import Job
    from django_venturi.registry import UnknownKind, registry
    from django_venturi.states import State
    from django_venturi.store.claim import ClaimedJob
    from django_venturi.store.clock import database_time

    token = uuid.uuid4()
    with transaction.atomic(using=alias):
        now = database_time(alias)
        row = Job.objects.using(alias).select_for_update().filter(id=job_id).first()
        if row is None or row.state != State.READY:
            return None
        try:
            lease = registry.get(row.kind).lease or venturi_settings.DEFAULT_LEASE
        except UnknownKind:
            lease = venturi_settings.DEFAULT_LEASE
        Job.objects.using(alias).filter(id=job_id).update(
            state=State.RUNNING,
            attempt=F("attempt") + 1,
            started_at=now,
            claim_token=token,
            claimed_by=INLINE_WORKER,
            lease_expires_at=now + lease,
        )
        row.refresh_from_db(using=alias)
    job = ClaimedJob.from_row(
        row, attempt=row.attempt, started_at=now, claim_token=token, lease=lease
    )
    return execute(alias, job)


def execute(alias: str, job: ClaimedJob) -> Ran:
    """Run a claimed job's handler here, then write its verdict as a worker would."""
    from asgiref.sync import async_to_sync

    from django_venturi.models import Job, JournalEntry
    from django_venturi.registry import UnknownKind, registry
    from django_venturi.store.completion import write_verdicts
    from django_venturi.worker.execution import Execution

    execution = Execution(job, database=alias, stop=threading.Event(), heartbeat=lambda _: True)
    try:
        is_async = registry.get(job.kind).is_async
    except UnknownKind:
        is_async = False
    verdict: Verdict = async_to_sync(execution.run_async)() if is_async else execution.run_sync()
    dirty, progress = execution.take_progress()
    if dirty:
        verdict = dataclasses.replace(verdict, set_progress=True, progress=progress)
    write_verdicts(alias, INLINE_WORKER, [verdict])
    entry = JournalEntry.objects.using(alias).filter(job_id=job.id).order_by("-id").first()
    state = Job.objects.using(alias).values_list("state", flat=True).get(id=job.id)
    return Ran(
        job_id=job.id,
        kind=job.kind,
        attempt=job.attempt,
        outcome=_journal_outcome(entry.outcome if entry else verdict.outcome),
        state=_state(state),
        error=verdict.error.summary() if verdict.error.type else "",
    )


def _journal_outcome(value: str) -> JournalOutcome:
    from django_venturi.states import JournalOutcome

    return JournalOutcome(value)


def _state(value: str) -> State:
    from django_venturi.states import State

    return State(value)


def _alias(using: str | None) -> str:
    from django_venturi.conf import venturi_settings

    return using or venturi_settings.DATABASE
