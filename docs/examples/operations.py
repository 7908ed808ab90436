"""Operating the queue from Python: history, stats, cleanup, signals and a health view."""

from __future__ import annotations

import collections
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils import timezone

import django_venturi as venturi
from django_venturi.store.retention import CleanupResult


# [history]
def recent_failures(hours: int = 1) -> list[str]:
    since = timezone.now() - timedelta(hours=hours)
    return [
        f"job #{entry.job_id} ({entry.job.kind}) attempt {entry.attempt}: {entry.error_message}"
        for entry in venturi.history(outcome=venturi.JournalOutcome.FAILED, since=since)[:50]
    ]


# [history end]


# [cleanup]
def purge_finished_jobs() -> CleanupResult:
    # Completed, failed and cancelled jobs that finished over a week ago, with their
    # journals, 1,000 jobs per short transaction. Live jobs are never touched.
    return venturi.cleanup(older_than=timedelta(days=7))


# [cleanup end]


# [signals]
from django.dispatch import receiver  # noqa: E402

from django_venturi.signals import job_finished  # noqa: E402

outcomes: collections.Counter[tuple[str, str]] = collections.Counter()


@receiver(job_finished, dispatch_uid="docs.examples.count_outcomes")
def count_outcomes(sender: Any, *, kind: str, outcome: str, **kwargs: Any) -> None:
    # Runs on the worker's results writer: keep it quick, never block.
    outcomes[(kind, outcome)] += 1


# [signals end]


# [health]
from django_venturi.migration_state import unapplied_migrations  # noqa: E402

MAX_QUEUE_LATENCY = timedelta(minutes=5)


def queue_health(request: HttpRequest) -> JsonResponse:
    """A monitoring endpoint: 503 when the schema is behind or a queue is falling behind."""
    problems = [f"migration {name} is not applied" for name in unapplied_migrations("default")]
    snapshot = venturi.stats()
    problems += [
        f"queue {queue!r}: the oldest due job has waited {age}"
        for queue, age in snapshot.oldest_due_age.items()
        if age > MAX_QUEUE_LATENCY
    ]
    body = {"ok": not problems, "problems": problems, **snapshot.as_dict()}
    return JsonResponse(body, status=503 if problems else 200)


# [health end]
