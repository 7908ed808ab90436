"""Run tallies: the stats' figures of finished runs, kept when cleanup deletes their journal.

Each journal entry counts in one of four columns:

- completed jobs: outcome `completed`;
- failed jobs: the run ended its job `failed`: outcome `failed`, or a `timeout`
  or `lease_expired` run that gave up (`verdicts.retry` keeps those outcomes and
  writes the give-up reason first in the message);
- retried runs: a failed run after which the job was retried (`retry`, or a
  `timeout` or `lease_expired` run that did not give up);
- other runs: `paused`, `released`, `cancelled` and `discarded`.

`venturi.stats()` counts the entries of its window and adds the `RunTally` rows
of the window, in one statement; whatever deletes jobs folds their entries of
the window into `RunTally` rows first, in the transaction of the delete, so a
figure neither drops nor doubles when its journal goes.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Count, Q, QuerySet
from django.db.models.functions import TruncMinute

from django_venturi.states import JournalOutcome

if TYPE_CHECKING:
    from django_venturi.models import Job, JournalEntry

WINDOW = timedelta(hours=1)
"""How far back the figures go: the current minute and the 59 before it."""
COLUMNS = ("completed_jobs", "failed_jobs", "retried_runs", "other_runs")
"""The four figures, in the order `Counts` and `RunTally` hold them."""
RETRYABLE = (JournalOutcome.RETRY, JournalOutcome.TIMEOUT, JournalOutcome.LEASE_EXPIRED)
"""Outcomes of a failed run that goes back to `ready`, unless it gave up."""


@dataclasses.dataclass(frozen=True, slots=True)
class Counts:
    """The figures of finished runs over some stretch of time."""

    completed_jobs: int = 0
    failed_jobs: int = 0
    """Runs that ended their job failed: a permanent failure or a give-up."""
    retried_runs: int = 0
    """Failed runs after which the job was retried."""
    other_runs: int = 0
    """Paused, released, cancelled or discarded runs."""

    def __add__(self, other: Counts) -> Counts:
        pairs = zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)
        return Counts(*(mine + theirs for mine, theirs in pairs))


def window_start(now: datetime) -> datetime:
    """The first minute the figures read at `now`: the window ends with `now`'s minute."""
    return now.replace(second=0, microsecond=0) + timedelta(minutes=1) - WINDOW


def gave_up() -> Q:
    """Journal entries of a `timeout` or `lease_expired` run that ended its job failed.

    A give-up's message is `verdicts.retry`'s: the reason (always starting with
    `GAVE_UP`), `GAVE_UP_SEPARATOR`, then the run's error. Without a give-up these
    outcomes carry venturi's own message (the timeout, the lost lease) or, for a
    handler that raised after its timeout, the exception's.
    """
    from django_venturi.store.verdicts import (  # at call time: it loads the models
        GAVE_UP,
        GAVE_UP_SEPARATOR,
    )

    return Q(
        outcome__in=[JournalOutcome.TIMEOUT, JournalOutcome.LEASE_EXPIRED],
        error_message__startswith=GAVE_UP,
        error_message__contains=GAVE_UP_SEPARATOR,
    )


def column_filters() -> dict[str, Q]:
    """Which journal entries each column counts (every entry in exactly one)."""
    give_up = gave_up()
    counted = [JournalOutcome.COMPLETED, JournalOutcome.FAILED, *RETRYABLE]
    return {
        "completed_jobs": Q(outcome=JournalOutcome.COMPLETED),
        "failed_jobs": Q(outcome=JournalOutcome.FAILED) | give_up,
        "retried_runs": Q(outcome__in=RETRYABLE) & ~give_up,
        "other_runs": ~Q(outcome__in=counted),
    }


def column_counts() -> dict[str, Count]:
    """`annotate()` arguments counting a group of journal entries by column."""
    return {name: Count("id", filter=where) for name, where in column_filters().items()}


def _journal_by_minute(entries: QuerySet[JournalEntry]) -> QuerySet[JournalEntry, Any]:
    return (
        entries.annotate(minute_start=TruncMinute("finished_at", tzinfo=UTC))
        .values("minute_start")
        .annotate(**column_counts())
        .values_list("minute_start", *COLUMNS)
        .order_by()
    )


def by_minute(alias: str, start: datetime, end: datetime) -> dict[datetime, Counts]:
    """The figures of each minute in [start, end): the journal's entries plus the tallies.

    One statement (a UNION ALL), so a cleanup that commits meanwhile is seen
    either before or after, never half: its entries counted twice or not at all.
    """
    from django_venturi.models import JournalEntry, RunTally

    journal = _journal_by_minute(
        JournalEntry.objects.using(alias).filter(finished_at__gte=start, finished_at__lt=end)
    )
    tallies = (
        RunTally.objects.using(alias)
        .filter(minute__gte=start, minute__lt=end)
        # Truncated like the journal's side, so that both have one column type.
        .annotate(minute_start=TruncMinute("minute", tzinfo=UTC))
        .values_list("minute_start", *COLUMNS)
        .order_by()
    )
    minutes: dict[datetime, Counts] = {}
    # No order (Django 6.1 would otherwise order the union by the model's Meta.ordering).
    for minute, *figures in journal.union(tallies, all=True).order_by():
        counts = Counts(*(int(figure) for figure in figures))
        minutes[minute] = minutes.get(minute, Counts()) + counts
    return minutes


def fold(alias: str, jobs: QuerySet[Job], *, since: datetime) -> int:
    """Add the journal entries of `jobs` that finished from `since` on to the tallies.

    Call it in the transaction that deletes `jobs`, before the delete. Return the
    tally rows written (one per minute that had entries).
    """
    from django_venturi.models import JournalEntry, RunTally

    entries = JournalEntry.objects.using(alias).filter(job__in=jobs, finished_at__gte=since)
    rows = [
        RunTally(minute=minute, **dict(zip(COLUMNS, figures, strict=True)))
        for minute, *figures in _journal_by_minute(entries)
    ]
    RunTally.objects.using(alias).bulk_create(rows)
    return len(rows)


def prune(alias: str, *, before: datetime) -> int:
    """Delete the tallies of minutes before `before` (no figure reads them any more)."""
    from django_venturi.models import RunTally

    deleted, _ = RunTally.objects.using(alias).filter(minute__lt=before).delete()
    return deleted
