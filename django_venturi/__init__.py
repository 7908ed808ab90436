"""django-venturi: a durable job queue for Django, kept in your own database.

Import as `import django_venturi as venturi`. Nothing here touches the database
or settings at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_venturi.context import Context
from django_venturi.observe.snapshot import stats
from django_venturi.outcomes import Outcome, TaskError
from django_venturi.payloads.codec import PayloadError, secret
from django_venturi.periodic import periodic
from django_venturi.registry import RegistrationError, UnknownKind
from django_venturi.states import JournalOutcome, Priority, State
from django_venturi.store.backoff import Fibonacci
from django_venturi.store.cancel import CancelResult, cancel
from django_venturi.store.concurrency import Concurrency
from django_venturi.store.dedup import Existing, Merge
from django_venturi.store.dependencies import UnknownDependency
from django_venturi.store.journal import history
from django_venturi.store.pauses import Paused, pause, paused, resume
from django_venturi.store.rate_limits import RateLimit
from django_venturi.store.retention import cleanup
from django_venturi.tasks import Task, task
from django_venturi.workflows import chain, group

if TYPE_CHECKING:
    from django_venturi.models import Job

__version__ = "0.1.0"

__all__ = [
    "CancelResult",
    "Concurrency",
    "Context",
    "Existing",
    "Fibonacci",
    "JournalOutcome",
    "Merge",
    "Outcome",
    "Paused",
    "PayloadError",
    "Priority",
    "RateLimit",
    "RegistrationError",
    "State",
    "Task",
    "TaskError",
    "UnknownDependency",
    "UnknownKind",
    "__version__",
    "cancel",
    "chain",
    "cleanup",
    "enqueue_many",
    "group",
    "history",
    "pause",
    "paused",
    "periodic",
    "resume",
    "secret",
    "stats",
    "task",
]


def enqueue_many(instances: Any, **options: Any) -> list[Job]:
    """Enqueue many task instances in the current transaction, one INSERT per batch.

    Options as for `enqueue`: `delay`, `run_at`, `priority`, `queue`, `using`,
    `after`, `after_failure`.
    """
    from django_venturi.conf import venturi_settings
    from django_venturi.enqueue import enqueue_many as _enqueue_many

    jobs = _enqueue_many(instances, **options)
    if venturi_settings.TESTING_EAGER:
        from django_venturi.worker.inline import run_enqueued

        run_enqueued(jobs)
    return jobs
