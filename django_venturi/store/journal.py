"""`venturi.history()`: the journal of executions, filtered, with their jobs."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import QuerySet

from django_venturi.conf import venturi_settings
from django_venturi.states import State

if TYPE_CHECKING:
    from django_venturi.models import JournalEntry


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
    """Return journal entries (newest first, each with its job) matching every filter given.

    `kind`, `state` (the job's current state) and `dedup_key` filter by the job;
    `outcome` by the execution; `since`/`until` bound when the execution finished.
    """
    from django_venturi.models import (
        JournalEntry,  # at call time: importing the package must not load models
    )

    entries = (
        JournalEntry.objects.using(using or venturi_settings.DATABASE)
        .select_related("job")
        .order_by("-finished_at", "-id")
    )
    if kind is not None:
        entries = entries.filter(job__kind=kind)
    if state is not None:
        entries = entries.filter(job__state=State(state))
    if outcome is not None:
        entries = entries.filter(outcome=outcome)
    if since is not None:
        entries = entries.filter(finished_at__gte=since)
    if until is not None:
        entries = entries.filter(finished_at__lt=until)
    if dedup_key is not None:
        entries = entries.filter(job__dedup_key=dedup_key)
    return entries
