"""Retry or cancel every job of a query, a batch at a time (the admin's "all in this filter").

The jobs are walked from the newest id down, `batch_size` ids at a time; each
batch is its own short transaction through `retry.retry_now` or
`cancel.cancel`, so no lock is held across the whole set, workers go on
claiming and finishing meanwhile, and a cancel reaches running jobs as a
single cancel does (their workers are notified at each batch's commit). A
job that enters the query after the walk passed its id is not touched.

With a `time_budget` the walk stops starting batches once that many seconds
have passed (the admin's request must answer before a proxy's timeout), and
says so (`complete` is False); running the same action again goes on with
what is left, since what was done no longer matches (a retried job is not
failed any more, a cancelled one is finished).

Errors: the database's errors as they are; the batches committed before one
failed stay done (the totals so far are lost with the exception).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from django.db import transaction

from django_venturi.states import State
from django_venturi.store.cancel import UNCLAIMED_STATES, cancel
from django_venturi.store.retry import RETRYABLE_STATES, retry_now

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from django_venturi.models import Job

BATCH_SIZE = 2_000
"""Ids per batch: a few milliseconds of locks each, and few round trips for 100,000 jobs."""


@dataclasses.dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk retry or cancel did, summed over its batches."""

    done: int
    """Jobs retried (now ready and due), or cancelled at once."""
    stopping: int = 0
    """Running jobs asked to stop (a cancel): they end `cancelled` when their handler returns."""
    clashes: int = 0
    """Failed jobs left failed by a retry: another ready job holds their kind and dedup key."""
    batches: int = 0
    complete: bool = True
    """False when the time budget ran out first: the rest of the query is left as it is."""


class IdBatches:
    """The ids of a query, newest first, `batch_size` at a time, read batch by batch, until
    none is left or `time_budget` seconds have passed (at least one batch runs)."""

    def __init__(self, queryset: QuerySet[Job], batch_size: int, time_budget: float | None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size: expected a positive number of jobs, got {batch_size!r}")
        if time_budget is not None and time_budget < 0:
            raise ValueError(f"time_budget: expected seconds (0 or more), got {time_budget!r}")
        self.ordered = queryset.order_by("-id").values_list("id", flat=True)
        self.batch_size = batch_size
        self.deadline = None if time_budget is None else time.monotonic() + time_budget
        self.complete = False
        self.count = 0

    def __iter__(self) -> Iterator[list[int]]:
        before: int | None = None
        while True:
            page = self.ordered if before is None else self.ordered.filter(id__lt=before)
            ids = list(page[: self.batch_size])
            if not ids:
                self.complete = True
                return
            if self.count and self.deadline is not None and time.monotonic() >= self.deadline:
                return
            self.count += 1
            yield ids
            before = ids[-1]


def retry_all(
    queryset: QuerySet[Job], *, batch_size: int = BATCH_SIZE, time_budget: float | None = None
) -> BulkResult:
    """Retry now every ready or failed job of `queryset` (`retry.retry_now`), in batches,
    for at most about `time_budget` seconds (None: until done)."""
    batches = IdBatches(queryset.filter(state__in=RETRYABLE_STATES), batch_size, time_budget)
    done = clashes = 0
    for ids in batches:
        result = retry_now(ids, using=queryset.db)
        done += len(result.retried)
        clashes += len(result.clashes)
    return BulkResult(done, clashes=clashes, batches=batches.count, complete=batches.complete)


def cancel_all(
    queryset: QuerySet[Job], *, batch_size: int = BATCH_SIZE, time_budget: float | None = None
) -> BulkResult:
    """Cancel every unfinished job of `queryset` (`cancel.cancel`), in batches, for at most
    about `time_budget` seconds (None: until done)."""
    unfinished = queryset.filter(state__in=(*UNCLAIMED_STATES, State.RUNNING))
    batches = IdBatches(unfinished, batch_size, time_budget)
    done = stopping = 0
    for ids in batches:
        with transaction.atomic(using=queryset.db):
            result = cancel(ids, using=queryset.db)
        done += result.cancelled
        stopping += result.stopping
    return BulkResult(done, stopping=stopping, batches=batches.count, complete=batches.complete)
