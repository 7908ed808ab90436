"""Writing `ctx.progress()`: throttled, fenced by claim token, off the handler's thread.

A handler may call `ctx.progress()` as often as it likes: the call only keeps
the latest value in memory. The worker's results writer writes the values
that changed, at most once per `PROGRESS_INTERVAL` for each job, and the last
value goes with the run's verdict. A worker that lost a job's claim writes
nothing for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction

from django_venturi.states import State
from django_venturi.store.claim import ClaimedJob

PROGRESS_INTERVAL = 1.0
"""Seconds between two progress writes of one job."""


def write_progress(alias: str, updates: Sequence[tuple[ClaimedJob, dict[str, Any] | None]]) -> None:
    """Store each running job's latest progress, if this worker still holds its claim."""
    from django_venturi.models import Job

    if not updates:
        return
    with transaction.atomic(using=alias):
        for job, progress in updates:
            Job.objects.using(alias).filter(
                id=job.id, claim_token=job.claim_token, state=State.RUNNING
            ).update(progress=progress)
