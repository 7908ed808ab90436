"""`venturi.cleanup()`: delete finished jobs (and their journals) in small batches.

Each batch is its own short transaction, so cleanup never holds locks for long
nor builds one huge transaction, however many rows it deletes. A batch locks
the rows it deletes and skips rows another session holds, so a job made ready
at the same moment (`retry_now`, the admin's retry) is never deleted.

Before a batch's delete, in its transaction, the journal entries of the stats'
window are folded into run tallies (`tallies.py`), so `venturi.stats()` reads
the same figures after a cleanup as before; tallies older than the window are
pruned at the end. `delete_jobs` does the same for any other delete (the admin's).

Errors: `ValueError` for a live state, a negative `older_than` or a
`batch_size` below 1 (nothing deleted); the database's errors as they are
(`django.db.DatabaseError`), with the batches before the failing one kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import QuerySet

from django_venturi.conf import venturi_settings
from django_venturi.states import FINISHED_STATES, State
from django_venturi.store import dependencies, registration, tallies
from django_venturi.store.clock import database_time, now_expression
from django_venturi.store.maintenance_lock import cleanup_turn

if TYPE_CHECKING:
    from django_venturi.models import Job

DEFAULT_BATCH_SIZE = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class CleanupResult:
    """What a cleanup deleted (or, with `dry_run`, would delete)."""

    jobs: int
    """Jobs deleted."""
    journal_entries: int
    """Journal entries deleted with them."""
    batches: int
    """Transactions used, one per batch."""
    workers: int = 0
    """Registry rows of workers stopped (or silent) for longer than `older_than`."""

    def counts(self, separator: str = " and ") -> str:
        """'1 job and 3 journal entries': what the cleanup deleted, in words."""
        jobs = f"{self.jobs} job" + ("" if self.jobs == 1 else "s")
        entries = f"{self.journal_entries} journal entr" + (
            "y" if self.journal_entries == 1 else "ies"
        )
        return f"{jobs}{separator}{entries}"

    def in_batches(self) -> str:
        """'in 1 batch', 'in 3 batches': the end of a report sentence."""
        return f"in {self.batches} batch" + ("" if self.batches == 1 else "es")


def cleanup(
    *,
    older_than: timedelta,
    states: Iterable[State | str] = FINISHED_STATES,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    using: str | None = None,
    progress: Callable[[CleanupResult], None] | None = None,
) -> CleanupResult:
    """Delete jobs that finished more than `older_than` ago in `states`, with their journals.

    Registry rows of workers stopped more than `older_than` ago go too.

    Only finished states are allowed: live jobs are never deleted. `progress`, if
    given, is called after each batch with the running totals.
    """
    from django_venturi.models import (  # at call time: importing the package must not load models
        Job,
        JournalEntry,
    )

    chosen = [State(state) for state in states]
    live = [state for state in chosen if state not in FINISHED_STATES]
    if live:
        raise ValueError(f"cleanup deletes finished jobs only, not {', '.join(live)}")
    if older_than < timedelta(0):
        raise ValueError("older_than must not be negative")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    alias = using or venturi_settings.DATABASE
    old = Job.objects.using(alias).filter(
        state__in=chosen, finished_at__lt=now_expression(alias) - older_than
    )
    if dry_run:
        return CleanupResult(
            jobs=old.count(),
            journal_entries=JournalEntry.objects.using(alias).filter(job__in=old).count(),
            batches=0,
        )
    with cleanup_turn(alias):  # never beside a maintenance run (`maintenance_lock.py`)
        return _delete_in_batches(alias, old, batch_size, older_than, progress)


def _delete_in_batches(
    alias: str,
    old: QuerySet[Job],
    batch_size: int,
    older_than: timedelta,
    progress: Callable[[CleanupResult], None] | None,
) -> CleanupResult:
    from django_venturi.models import Job, JournalEntry

    since = tallies.window_start(database_time(alias))
    jobs = entries = batches = 0
    while True:
        with transaction.atomic(using=alias):
            # Lock the batch's rows: the delete below goes by id, so a job that
            # `retry_now` makes ready meanwhile must wait for it, not be deleted by it.
            # Rows locked by someone else right now are skipped (a later run takes them).
            batch = old.select_for_update(skip_locked=True).order_by("id")
            rows = list(batch.values_list("id", "dependents")[:batch_size])
            if not rows:
                break
            ids = [job_id for job_id, _ in rows]
            # Open edges of a job deleted here would go with it and leave its
            # dependents waiting: resolve them first, as its verdict would have.
            dependencies.resolve(alias, [job_id for job_id, count in rows if count])
            _, deleted = _fold_and_delete(alias, old.filter(id__in=ids), since)
        jobs += deleted.get(Job._meta.label, 0)
        entries += deleted.get(JournalEntry._meta.label, 0)
        batches += 1
        if progress is not None:
            progress(CleanupResult(jobs, entries, batches))
    workers = registration.prune(alias, older_than=older_than)
    tallies.prune(alias, before=since)
    return CleanupResult(jobs, entries, batches, workers)


def delete_jobs(jobs: QuerySet[Job], *, using: str) -> tuple[int, dict[str, int]]:
    """Delete `jobs` (in any state) and their journals, keeping the stats' figures.

    Their journal entries of the stats' window are folded into run tallies in
    the transaction of the delete. Jobs waiting for an unfinished job deleted here
    are cancelled as if it had been, and jobs still waiting for a finished one
    (its verdict's worker died before resolving them) are resolved as its verdict
    would have (see `dependencies.py`). Return what
    `QuerySet.delete()` returns.
    """
    since = tallies.window_start(database_time(using))
    with transaction.atomic(using=using):
        # Lock them first: a verdict being written for one of them (it holds the
        # job's row) is committed, journal entry and all, before the journal is read.
        list(
            jobs.model.objects.using(using)
            .filter(id__in=jobs.using(using).values("id"))
            .select_for_update()
            .values_list("id", flat=True)
        )
        _cancel_waiting_for(using, jobs.using(using))
        return _fold_and_delete(using, jobs.using(using), since)


def _cancel_waiting_for(alias: str, jobs: QuerySet[Job]) -> None:
    """End the unfinished jobs of `jobs` that have dependents `cancelled`, and resolve
    the dependents of all of them (a finished one's open edges too)."""
    rows = list(jobs.filter(dependents__gt=0).values_list("id", "state"))
    if not rows:
        return
    unfinished = [job_id for job_id, state in rows if state not in FINISHED_STATES]
    if unfinished:
        jobs.filter(id__in=unfinished).update(
            state=State.CANCELLED,
            finished_at=now_expression(alias),
            waiting_for=0,
            claim_token=None,
            lease_expires_at=None,
        )
    dependencies.resolve(alias, [job_id for job_id, _ in rows])


def _fold_and_delete(
    alias: str, jobs: QuerySet[Job], since: datetime
) -> tuple[int, dict[str, int]]:
    """Fold the journal of `jobs` into tallies, then delete them; call it in a transaction."""
    tallies.fold(alias, jobs, since=since)
    return jobs.delete()
