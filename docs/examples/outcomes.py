"""Outcomes: completed, retry (raised or returned), permanent failure, and pause with a carry."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from django.contrib.auth.models import User

import django_venturi as venturi


# [outcomes]
@venturi.task(
    kind="docs.welcome_when_active",
    max_attempts=10,  # the tenth failed run is final
    give_up_after=timedelta(days=2),  # ... and so is any failure two days after the enqueue
)
@dataclasses.dataclass
class WelcomeWhenActive(venturi.Task):
    user_id: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        user = User.objects.filter(pk=self.user_id).first()
        if user is None:
            # Permanent: retrying cannot help. Outcome.failed("...") does the same.
            raise venturi.TaskError.permanent(f"no user #{self.user_id}")
        if not user.is_active:
            # Retryable, after exactly this long (without `after`: the task's backoff).
            return venturi.Outcome.retry(after=timedelta(minutes=10))
        # Any exception raised from here on (a timeout, a lost connection) is retried
        # with Fibonacci backoff: 1 s, 1 s, 2 s, 3 s, 5 s, ... capped at an hour.
        return venturi.Outcome.completed()


# [outcomes end]


# [pause]
@dataclasses.dataclass
class Cursor:
    last_id: int
    exported: int


@venturi.task(kind="docs.export_users", carry=Cursor)
@dataclasses.dataclass
class ExportUsers(venturi.Task):
    batch: int = 500
    batches_per_run: int = 10

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        cursor = ctx.carry or Cursor(last_id=0, exported=0)  # None on the first run
        for _ in range(self.batches_per_run):
            if ctx.should_stop:  # the worker is shutting down, or lost this job
                break
            users = list(User.objects.filter(id__gt=cursor.last_id).order_by("id")[: self.batch])
            if not users:
                return venturi.Outcome.completed()
            export(users)
            cursor = Cursor(last_id=users[-1].id, exported=cursor.exported + len(users))
        # Checkpoint: the next run starts here, and other jobs get the slot meanwhile.
        return venturi.Outcome.paused(cursor)


# [pause end]


def export(users: list[User]) -> None:
    """Stands in for the real export (a file, an API)."""
