"""django-venturi: a durable job queue for Django, kept in your own database.

Import as `import django_venturi as venturi`. Nothing here touches the database
or settings at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_venturi.backoff import Fibonacci
from django_venturi.codec import PayloadError, secret
from django_venturi.context import Context
from django_venturi.dedup import Existing, Merge
from django_venturi.outcomes import Outcome, TaskError
from django_venturi.registry import RegistrationError, UnknownKind
from django_venturi.states import JournalOutcome, Priority, State
from django_venturi.tasks import Task, task

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from django.db.models import QuerySet

    from django_venturi.models import Job, JournalEntry
    from django_venturi.retention import CleanupResult
    from django_venturi.snapshot import Stats

__version__ = "0.1.0"

__all__ = [
    "Context",
    "Existing",
    "Fibonacci",
    "JournalOutcome",
    "Merge",
    "Outcome",
    "PayloadError",
    "Priority",
    "RegistrationError",
    "State",
    "Task",
    "TaskError",
    "UnknownKind",
    "__version__",
    "cleanup",
    "enqueue_many",
    "history",
    "secret",
    "stats",
    "task",
]


def enqueue_many(instances: Any, **options: Any) -> list[Job]:
    """Enqueue many task instances in the current transaction, one INSERT per batch.

    Options as for `enqueue`: `delay`, `run_at`, `priority`, `queue`, `using`.
    """
    from django_venturi.enqueue import enqueue_many as _enqueue_many

    return _enqueue_many(instances, **options)


# The functions below import the models when called, never at import time.


def history(
    *,
    kind: str | None = None,
    state: State | str | None = None,
    outcome: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    dedup_key: str | None = None,
    using: str | None = None,
) -> QuerySet[JournalEntry]:
    """Journal entries (newest first, with their jobs) matching every filter given."""
    from django_venturi.journal import history as _history

    return _history(
        kind=kind,
        state=state,
        outcome=outcome,
        since=since,
        until=until,
        dedup_key=dedup_key,
        using=using,
    )


def stats(*, using: str | None = None) -> Stats:
    """A live snapshot: ready/running by kind and queue, queue latency, the last hour."""
    from django_venturi.snapshot import stats as _stats

    return _stats(using=using)


def cleanup(
    *,
    older_than: timedelta,
    states: Any = None,
    batch_size: int = 1000,
    dry_run: bool = False,
    using: str | None = None,
) -> CleanupResult:
    """Delete finished jobs older than `older_than` (and their journals) in short batches."""
    from django_venturi.retention import cleanup as _cleanup
    from django_venturi.states import FINISHED_STATES

    return _cleanup(
        older_than=older_than,
        states=FINISHED_STATES if states is None else states,
        batch_size=batch_size,
        dry_run=dry_run,
        using=using,
    )
