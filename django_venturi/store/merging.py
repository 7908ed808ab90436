"""Producers merging a keyed job into the live job of its kind and key.

One producer of a key at a time: it holds the key's transaction-level advisory
lock (`key_locks.lock_keys`; SQLite's IMMEDIATE transactions serialise everything)
while it finds the live job, locks that row, asks the task's `merge()` and
writes the decision, or inserts the job when nothing live is in the way. A
rollback of the caller's transaction undoes the merge.

What a job is and how it is inserted is `enqueue.py`'s: it hands its new job
and its insert function in, so this module needs nothing of it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django.db import connections
from django.db.models import Case, F, IntegerField, Value, When
from django.db.models.functions import Now

from django_venturi.registry import TaskSpec, registry
from django_venturi.states import LIVE_STATES, State
from django_venturi.store.deadlocks import retrying_deadlocks
from django_venturi.store.dedup import (
    Merge,
    MergeKind,
    decide,
    decided_changes,
    existing_of,
    new_payload,
)
from django_venturi.store.key_locks import lock_keys

if TYPE_CHECKING:
    from django_venturi.models import Job

logger = logging.getLogger("django_venturi.dedup")

MAX_ROUNDS = 20
"""Clash rounds per enqueue: a new round starts only when the existing job just finished."""


class KeyedJob(Protocol):
    """What merging needs of a new job (`enqueue.NewJob`)."""

    @property
    def kind(self) -> str: ...

    @property
    def dedup_key(self) -> str | None: ...

    @property
    def instance(self) -> object: ...


K = TypeVar("K", bound=KeyedJob)
Insert = Callable[[str, K], "Job | None"]
"""Insert a keyed job; None if a ready job of its key is in the way."""


def enqueue_keyed(alias: str, new_job: K, insert: Insert[K]) -> Job:
    """Write one job that has a dedup key: insert it (`insert`), or merge it with the live one."""
    # A cycle through rows this transaction locked earlier (another key's merge) and a
    # worker's batch: tried again in a savepoint (`deadlocks`).
    return retrying_deadlocks(alias, lambda: _enqueue_keyed(alias, new_job, insert))


_LIVE_SQL = """
SELECT * FROM {table}
WHERE kind = %s AND dedup_key = %s AND state IN ('ready', 'running')
  -- A running job asked to cancel ends cancelled: it covers no new work.
  AND (state = 'ready' OR cancel_requested_at IS NULL)
-- The ready job if there is one (a follow-up behind a running job), else the newest running.
ORDER BY state = 'ready' DESC, id DESC
LIMIT 1
-- A row that is claimed or finished while this waits for its lock is seen as it is
-- then: running, or skipped (the next candidate takes its place).
FOR UPDATE
"""


def _live_first(alias: str, kind: str, key: str) -> Job | None:
    """The live job a new one clashes with, row-locked: the ready one, else the newest running.

    A running job whose cancel was requested is not a candidate: it will end
    `cancelled` whatever its handler returns, so work merged into it would be lost.
    The new job queues behind it as a follow-up instead.
    """
    from django_venturi.models import Job

    if connections[alias].vendor == "postgresql":
        table = connections[alias].ops.quote_name(Job._meta.db_table)
        found = list(Job.objects.db_manager(alias).raw(_LIVE_SQL.format(table=table), [kind, key]))
        return found[0] if found else None
    ready_first = Case(
        When(state=State.READY, then=Value(0)), default=Value(1), output_field=IntegerField()
    )
    return (
        Job.objects.using(alias)
        .filter(kind=kind, dedup_key=key, state__in=LIVE_STATES)
        .exclude(state=State.RUNNING, cancel_requested_at__isnull=False)
        .order_by(ready_first, "-id")
        .first()
    )


def _enqueue_keyed(alias: str, new_job: K, insert: Insert[K]) -> Job:
    assert new_job.dedup_key is not None
    spec = registry.get(new_job.kind)
    lock_keys(alias, [(new_job.kind, new_job.dedup_key)])
    for _ in range(MAX_ROUNDS):
        existing = _live_first(alias, new_job.kind, new_job.dedup_key)
        if existing is not None:
            # `decide` refuses `enqueue` against a ready job: only a running one gets a
            # follow-up, inserted below.
            decision = decide(spec, new_job.instance, existing_of(alias, spec, existing))
            if decision.kind is not MergeKind.ENQUEUE:
                return _apply(alias, spec, new_job, existing, decision)
        inserted = insert(alias, new_job)
        if inserted is not None:
            return inserted
        # A ready job appeared (a rolled-back finish): clash with it next round.
    raise RuntimeError(
        f"could not enqueue {new_job.kind} with dedup_key {new_job.dedup_key!r}: "
        f"the live job kept changing for {MAX_ROUNDS} rounds"
    )


def _apply(alias: str, spec: TaskSpec, new_job: K, job: Job, decision: Merge) -> Job:
    payload = new_payload(spec, new_job.instance, decision)
    # A fair kind's key follows its payload (None: the key stays as it is).
    fair_key = None if payload is None else spec.fair_key(payload)
    if connections[alias].vendor == "postgresql":
        _apply_postgresql(alias, job, payload, decision, fair_key)
    else:
        _apply_orm(alias, job, payload, decision, fair_key)
    logger.debug(
        "merged a %s enqueue into job %d (%s)",
        job.kind,
        job.pk,
        decision.kind.value,
        extra={"job_id": job.pk, "kind": job.kind, "merge": decision.kind.value},
    )
    return job


_MERGE_SQL = """
WITH merged AS (
    UPDATE {table}
    SET merged_count = merged_count + 1,
        last_merged_at = now(),
        payload = coalesce(%s::jsonb, payload),
        fair_key = coalesce(%s, fair_key),
        run_at = coalesce(%s::timestamptz, run_at),
        priority = coalesce(%s::smallint, priority)
    WHERE id = %s
    RETURNING payload, run_at, priority, merged_count, last_merged_at
)
-- A ready job may have become due sooner: the enqueue wakes a waiting worker after
-- its commit (`waiting_workers.py`), never inside this transaction.
SELECT payload, run_at, priority, merged_count, last_merged_at FROM merged
"""


def _apply_postgresql(
    alias: str, job: Job, payload: dict[str, Any] | None, decision: Merge, fair_key: str | None
) -> None:
    from django_venturi.models import Job

    connection = connections[alias]
    sql = _MERGE_SQL.format(table=connection.ops.quote_name(Job._meta.db_table))
    params = [
        None if payload is None else json.dumps(payload),
        fair_key,
        decision.run_at,
        None if decision.priority is None else int(decision.priority),
        job.pk,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    assert row is not None  # the row is locked by this transaction
    stored = row[0]
    job.payload = json.loads(stored) if isinstance(stored, str) else stored
    job.run_at, job.priority, job.merged_count, job.last_merged_at = row[1:5]
    if fair_key is not None:
        job.fair_key = fair_key


def _apply_orm(
    alias: str, job: Job, payload: dict[str, Any] | None, decision: Merge, fair_key: str | None
) -> None:
    from django_venturi.models import Job

    changes: dict[str, Any] = {"merged_count": F("merged_count") + 1, "last_merged_at": Now()}
    changes.update(decided_changes(payload, decision))
    if fair_key is not None:
        changes["fair_key"] = fair_key
    Job.objects.using(alias).filter(pk=job.pk).update(**changes)
    job.refresh_from_db(
        using=alias,
        fields=["payload", "fair_key", "run_at", "priority", "merged_count", "last_merged_at"],
    )
