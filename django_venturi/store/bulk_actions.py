"""Retry or cancel every job of a query, a batch at a time (the admin's "all in this filter").

The jobs are walked from the newest id down, `batch_size` ids at a time; each
batch is its own short transaction through `retry.retry_now` or
`cancel.cancel`, so no lock is held across the whole set, workers go on
claiming and finishing meanwhile, and a cancel reaches running jobs as a
single cancel does (their workers are notified at each batch's commit). A
job that enters the query after the walk passed its id is not touched.

Errors: the database's errors as they are; the batches committed before one
failed stay done (the totals so far are lost with the exception).
"""

from __future__ import annotations

import dataclasses
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


def id_batches(queryset: QuerySet[Job], batch_size: int) -> Iterator[list[int]]:
    """The ids of `queryset`, newest first, `batch_size` at a time, read batch by batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive number of jobs, got {batch_size!r}")
    ordered = queryset.order_by("-id").values_list("id", flat=True)
    before: int | None = None
    while True:
        page = ordered if before is None else ordered.filter(id__lt=before)
        ids = list(page[:batch_size])
        if not ids:
            return
        yield ids
        before = ids[-1]


def retry_all(queryset: QuerySet[Job], *, batch_size: int = BATCH_SIZE) -> BulkResult:
    """Retry now every ready or failed job of `queryset` (`retry.retry_now`), in batches."""
    retryable = queryset.filter(state__in=RETRYABLE_STATES)
    done = clashes = batches = 0
    for ids in id_batches(retryable, batch_size):
        result = retry_now(ids, using=queryset.db)
        done += len(result.retried)
        clashes += len(result.clashes)
        batches += 1
    return BulkResult(done=done, clashes=clashes, batches=batches)


def cancel_all(queryset: QuerySet[Job], *, batch_size: int = BATCH_SIZE) -> BulkResult:
    """Cancel every unfinished job of `queryset` (`cancel.cancel`), in batches."""
    unfinished = queryset.filter(state__in=(*UNCLAIMED_STATES, State.RUNNING))
    done = stopping = batches = 0
    for ids in id_batches(unfinished, batch_size):
        with transaction.atomic(using=queryset.db):
            result = cancel(ids, using=queryset.db)
        done += result.cancelled
        stopping += result.stopping
        batches += 1
    return BulkResult(done=done, stopping=stopping, batches=batches)
