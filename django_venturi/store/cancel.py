"""`venturi.cancel()`: a ready job is cancelled at once; a running one is asked to stop.

A ready or waiting job becomes `cancelled` at once, in the caller's
transaction, and so do the jobs waiting for it (see `dependencies.py`). A running
job gets `cancel_requested_at` set, and on PostgreSQL a notification on the
cancel channel tells its worker right away (other databases: the worker sees
the request at its next heartbeat). Its handler then sees `ctx.should_stop`;
when it returns, the job ends `cancelled` and its journal entry says so.
Finished jobs are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db import connections, transaction

from django_venturi.conf import venturi_settings
from django_venturi.states import State
from django_venturi.store import dependencies
from django_venturi.store.clock import now_expression

if TYPE_CHECKING:
    from django_venturi.models import Job


NOTIFY_IDS_PER_PAYLOAD = 400


@dataclasses.dataclass(frozen=True, slots=True)
class CancelResult:
    """What a cancel did."""

    cancelled: int
    """Ready and waiting jobs now `cancelled` (not counting their dependents)."""
    stopping: int
    """Running jobs asked to stop; they end `cancelled` when their handler returns."""


def cancel_channel() -> str:
    """The PostgreSQL channel that carries cancel requests to workers."""
    return f"{venturi_settings.NOTIFY_CHANNEL}_cancel"


def cancel(jobs: Job | int | Iterable[Job | int], *, using: str | None = None) -> CancelResult:
    """Cancel jobs by row or id, inside the caller's transaction if there is one.

    Jobs enqueued after a cancelled job are cancelled too, unless enqueued with
    `after_failure="run"`.
    """
    from django_venturi.models import (
        Job,
    )  # at call time: importing the package must not load models

    ids = _ids(jobs)
    alias = using or venturi_settings.DATABASE
    if not ids:
        return CancelResult(cancelled=0, stopping=0)
    now = now_expression(alias)
    with transaction.atomic(using=alias):
        unclaimed = dict(
            Job.objects.using(alias)
            .select_for_update()
            .filter(id__in=ids, state__in=(State.READY, State.WAITING))
            .order_by("id")
            .values_list("id", "dependents")
        )
        cancelled = (
            Job.objects.using(alias)
            .filter(id__in=list(unclaimed))
            .update(state=State.CANCELLED, finished_at=now, waiting_for=0)
        )
        dependencies.resolve(alias, [job_id for job_id, count in unclaimed.items() if count])
        stopping = list(
            Job.objects.using(alias)
            .filter(id__in=ids, state=State.RUNNING, cancel_requested_at__isnull=True)
            .values_list("id", flat=True)
        )
        if stopping:
            Job.objects.using(alias).filter(id__in=stopping).update(cancel_requested_at=now)
            _notify_workers(alias, stopping)
    return CancelResult(cancelled=cancelled, stopping=len(stopping))


def _ids(jobs: Job | int | Iterable[Job | int]) -> list[int]:
    items = jobs if isinstance(jobs, Iterable) else [jobs]
    return [item if isinstance(item, int) else int(item.pk) for item in items]


def _notify_workers(alias: str, job_ids: list[int]) -> None:
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        # Delivered at commit, so a worker never looks before the request is visible.
        # A payload holds comma-separated ids, within PostgreSQL's 8,000-byte limit.
        for start in range(0, len(job_ids), NOTIFY_IDS_PER_PAYLOAD):
            chunk = job_ids[start : start + NOTIFY_IDS_PER_PAYLOAD]
            cursor.execute(
                "SELECT pg_notify(%s, %s)", [cancel_channel(), ",".join(map(str, chunk))]
            )
