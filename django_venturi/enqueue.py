"""Writing jobs: one or many rows inside the caller's transaction.

On PostgreSQL one statement inserts the rows; a batch goes in as one JSON document
of rows, so it is one round trip. The transaction sends no NOTIFY: after it commits,
a waiting worker of each queue is woken (`store/waiting_workers.py`), so a
rolled-back enqueue wakes nobody and concurrent producers never commit one at a time
behind PostgreSQL's NOTIFY lock. Other databases use the ORM.

Jobs with a dedup key take another path, one job at a time: see `dedup.py`.

Checking a job (`prepare`) and the INSERT statements are one path, measured and
tuned together; `store/inserted_jobs.py` builds the returned `Job`s from what was
sent, without a query.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from django_venturi import tracing
from django_venturi.conf import venturi_settings
from django_venturi.models import Job
from django_venturi.payloads.size import PayloadTooLarge, check_size
from django_venturi.registry import MAX_QUEUE_LENGTH, TaskSpec, spec_of, validate_name
from django_venturi.states import Priority, State
from django_venturi.store import (
    dependencies,
    inserted_jobs,
    key_locks,
    merging,
    missing_tables,
    statements,
    waiting_workers,
)
from django_venturi.store.backoff import MAX_DELAY, checked_delay
from django_venturi.store.clock import check_representable
from django_venturi.store.dedup import key_of

PRIORITY_VALUES = frozenset(Priority.values)
INSERT_BATCH_SIZE = 5000
"""Rows per INSERT statement in `enqueue_many` (all in the caller's transaction)."""
INSERT_BATCH_BYTES = 64_000_000
"""And at most this many bytes of payloads per INSERT (past its first row): a batch
goes in as one jsonb document, which PostgreSQL refuses over 268,435,455 bytes."""


@dataclass(slots=True)
class NewJob:
    """A validated, encoded job about to be inserted (never changed once made: not
    frozen only because a frozen dataclass's `__init__` cost a quarter of `prepare`)."""

    kind: str
    queue: str
    priority: int
    payload: dict[str, Any]
    run_at: datetime | None
    delay: timedelta | None
    dedup_key: str | None = None
    instance: object = None
    """The task instance, for its `merge()` on a dedup clash."""
    size: int = 0
    """The payload's size, in bytes of compact JSON (`payloads.size.encoded_size`)."""
    fair_key: str | None = None
    """The value of the task's `fair_by` field, as the claim takes turns by it."""
    trace_context: dict[str, str] | None = None
    """The W3C headers of the span that enqueued it (`tracing.py`), with `METRICS` on."""


def job_database(using: str | None) -> str:
    """The alias jobs are written to: `using`, else `VENTURI["DATABASE"]`."""
    return using or venturi_settings.DATABASE


def enqueue_one(
    instance: object,
    *,
    delay: timedelta | float | None = None,
    run_at: datetime | None = None,
    priority: Priority | None = None,
    queue: str | None = None,
    using: str | None = None,
    after: Iterable[Job | int] | None = None,
    after_failure: str = "cancel",
) -> Job:
    """Insert one job; see `Task.enqueue`."""
    (job,) = enqueue_many(
        [instance],
        delay=delay,
        run_at=run_at,
        priority=priority,
        queue=queue,
        using=using,
        after=after,
        after_failure=after_failure,
    )
    return job


def enqueue_many(
    instances: Iterable[object],
    *,
    delay: timedelta | float | None = None,
    run_at: datetime | None = None,
    priority: Priority | None = None,
    queue: str | None = None,
    using: str | None = None,
    after: Iterable[Job | int] | None = None,
    after_failure: str = "cancel",
) -> list[Job]:
    """Insert many jobs (of any kinds) in the caller's transaction, one INSERT per batch.

    Every payload is checked before anything is written: one bad payload raises
    and writes nothing (one over `VENTURI["MAX_PAYLOAD_BYTES"]` raises
    `PayloadTooLarge` naming its place in the batch). All or nothing: outside a
    transaction the batches run in one of their own, so an error in any of them
    writes none. Returns the rows in the order given.

    Raises what `prepare` raises for a bad task or option (`TypeError`,
    `ValueError`, `PayloadError`), what a task's `dedup_key()` or
    `merge()` raises, and the database's errors as they are
    (`django.db.DatabaseError`); a deadlock of a keyed enqueue is retried a few
    times first (`deadlocks.TRIES`).

    Jobs with a dedup key are written one by one after the others, each one
    merged with the live job of its key (or with an earlier one of the batch).

    With `after` (jobs or ids), every job waits until all of those complete (see
    `dependencies.py`); `after_failure="run"` runs them even if some fail or are
    cancelled. Raises `UnknownDependency` for an id with no job.
    """
    given = instances if isinstance(instances, list | tuple) else list(instances)
    new_jobs: list[NewJob] = []
    for index, instance in enumerate(given):
        try:
            job = prepare(instance, delay=delay, run_at=run_at, priority=priority, queue=queue)
        except PayloadTooLarge as error:
            raise error.in_batch(index, len(given)) from None
        new_jobs.append(job)
    context = tracing.current()  # one span enqueues the whole batch
    if context is not None:
        for job in new_jobs:
            job.trace_context = context
    alias = job_database(using)
    with missing_tables.explaining(alias):  # before `migrate`: say so
        jobs = _write(alias, new_jobs, after, after_failure)
    waiting_workers.wake_after_commit(alias, (job.queue for job in new_jobs))
    return jobs


def _write(
    alias: str,
    new_jobs: Sequence[NewJob],
    after: Iterable[Job | int] | None,
    after_failure: str,
) -> list[Job]:
    if after is not None:
        return _enqueue_after(alias, new_jobs, after, after_failure)
    plain = [job for job in new_jobs if job.dedup_key is None]
    if len(plain) == len(new_jobs):
        # One batch is one statement, atomic on its own; more are one transaction,
        # so a failing later batch takes the earlier ones with it.
        batches = _batches(new_jobs)
        jobs: list[Job] = []
        with transaction.atomic(using=alias) if len(batches) > 1 else nullcontext():
            for batch in batches:
                jobs.extend(_insert(alias, new_jobs[batch]))
        return jobs
    return _enqueue_mixed(alias, new_jobs)


def _enqueue_after(
    alias: str, new_jobs: Sequence[NewJob], after: Iterable[Job | int], after_failure: str
) -> list[Job]:
    """Insert jobs that wait for `after`, with their edges, in one transaction."""
    ids = dependencies.dependency_ids(after)
    run_after_failure = dependencies.check_after_failure(after_failure)
    if any(job.dedup_key is not None for job in new_jobs):
        raise ValueError("a job with a dedup key cannot be enqueued after other jobs")
    with transaction.atomic(using=alias):
        waits_for = dependencies.lock(
            alias, ids, jobs=len(new_jobs), run_after_failure=run_after_failure
        )
        jobs: list[Job] = []
        for batch in _batches(new_jobs):
            jobs.extend(_insert(alias, new_jobs[batch]))
        dependencies.attach(alias, jobs, waits_for)
    return jobs


def _enqueue_mixed(alias: str, new_jobs: Sequence[NewJob]) -> list[Job]:
    if len(new_jobs) == 1:
        return [merging.enqueue_keyed(alias, new_jobs[0], insert_keyed)]
    results: list[Job | None] = [None] * len(new_jobs)
    plain = [index for index, job in enumerate(new_jobs) if job.dedup_key is None]
    plain_jobs = [new_jobs[index] for index in plain]
    with transaction.atomic(using=alias):
        for batch in _batches(plain_jobs):
            for index, job in zip(plain[batch], _insert(alias, plain_jobs[batch]), strict=True):
                results[index] = job
        # Keys in a stable order, so that two batches sharing keys lock them alike;
        # duplicates within the batch keep their order and merge one after another.
        keyed = sorted(
            (index for index, job in enumerate(new_jobs) if job.dedup_key is not None),
            key=lambda index: (new_jobs[index].kind, new_jobs[index].dedup_key or "", index),
        )
        key_locks.lock_keys(alias, [(new_jobs[i].kind, new_jobs[i].dedup_key or "") for i in keyed])
        for index in keyed:
            results[index] = merging.enqueue_keyed(alias, new_jobs[index], insert_keyed)
    return [job for job in results if job is not None]


def _batches(new_jobs: Sequence[NewJob]) -> list[slice]:
    """`new_jobs` cut into INSERT statements: each of at most INSERT_BATCH_SIZE rows and,
    past its first row, INSERT_BATCH_BYTES of payloads."""
    batches, start, weight = [], 0, 0
    for index, job in enumerate(new_jobs):
        if index > start and (
            index - start == INSERT_BATCH_SIZE or weight + job.size > INSERT_BATCH_BYTES
        ):
            batches.append(slice(start, index))
            start, weight = index, 0
        weight += job.size
    return [*batches, slice(start, len(new_jobs))] if new_jobs else []


def prepare(
    instance: object,
    *,
    delay: timedelta | float | None,
    run_at: datetime | None,
    priority: Priority | None,
    queue: str | None,
) -> NewJob:
    """Validate a task instance and its options, and encode its payload."""
    spec: TaskSpec = spec_of(instance)
    if delay is not None and run_at is not None:
        raise ValueError("give delay or run_at, not both")
    wait = None if delay is None else checked_delay(delay, "delay", longest=MAX_DELAY)
    if run_at is not None and not isinstance(run_at, datetime):
        raise TypeError(f"run_at must be a datetime, got {type(run_at).__name__}")
    if run_at is not None and timezone.is_naive(run_at):
        raise ValueError("run_at must be timezone-aware (use django.utils.timezone)")
    if run_at is not None:
        check_representable(run_at, "run_at")
    chosen_queue = queue or spec.queue or venturi_settings.DEFAULT_QUEUE
    validate_name(chosen_queue, field="queue", max_length=MAX_QUEUE_LENGTH)
    chosen_priority = spec.priority if priority is None else priority
    if chosen_priority not in PRIORITY_VALUES:
        raise ValueError(f"priority must be a venturi.Priority, got {chosen_priority!r}")
    payload = spec.encode(instance)
    size = check_size(payload, spec.cls.__name__, venturi_settings.MAX_PAYLOAD_BYTES)
    return NewJob(
        kind=spec.kind,
        queue=chosen_queue,
        priority=int(chosen_priority),
        payload=payload,
        run_at=run_at,
        delay=wait,
        dedup_key=key_of(spec, instance),
        instance=instance,
        size=size,
        fair_key=spec.fair_key(payload),
    )


def _insert(alias: str, new_jobs: Sequence[NewJob]) -> list[Job]:
    if not new_jobs:
        return []
    if connections[alias].vendor == "postgresql":
        return _insert_postgresql(alias, new_jobs)
    return _insert_orm(alias, new_jobs)


_INSERT_ONE_SQL = """
    WITH inserted AS (
        INSERT INTO {table}
            (kind, queue, priority, state, payload, fair_key, trace_context, attempt,
             failures, run_at, enqueued_at, claimed_by, last_error)
        VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s::jsonb, 0, 0,
                coalesce(%s::timestamptz, now() + coalesce(%s::interval, interval '0')),
                now(), '', '')
        RETURNING id, run_at, enqueued_at
    )
    SELECT id, run_at, enqueued_at FROM inserted
"""


def _insert_one_postgresql(alias: str, job: NewJob) -> Job:
    """One job: a plain VALUES insert, cheaper to plan than the batch form."""
    sql = _on_job_table(alias, _INSERT_ONE_SQL)
    params: list[Any] = [
        job.kind,
        job.queue,
        job.priority,
        State.READY.value,
        json.dumps(job.payload),
        job.fair_key,
        _trace_parameter(job.trace_context),
        job.run_at,
        job.delay,
    ]
    (row,) = statements.fetch(alias, sql, params)
    return _loaded(alias, job, row)


def _on_job_table(alias: str, template: str) -> str:
    """`template` with `{table}` filled in: the quoted name of the job table on `alias`."""
    return _formatted(template, connections[alias].ops.quote_name(Job._meta.db_table))


@functools.cache
def _formatted(template: str, table: str) -> str:
    return template.format(table=table)


def _insert_postgresql(alias: str, new_jobs: Sequence[NewJob]) -> list[Job]:
    if len(new_jobs) == 1:
        return [_insert_one_postgresql(alias, new_jobs[0])]
    params = [
        _rows_document(new_jobs),
        State.READY.value,
        _trace_parameter(new_jobs[0].trace_context),  # one enqueue_many: one span
    ]
    rows = statements.fetch(alias, _on_job_table(alias, _INSERT_MANY_SQL), params)
    return _loaded_many(alias, new_jobs, rows)


# The rows come in as one JSON document, `[[kind, queue, priority, payload, run_at,
# delay seconds, fair key (a fair kind's only)], ...]`: one parameter however many
# rows, dumped by the json module in C, where arrays of text would be quoted element
# by element. `ord` keeps the RETURNING order equal to the input order.
_INSERT_MANY_SQL = """
    WITH rows AS (
        SELECT r.value ->> 0 AS kind, r.value ->> 1 AS queue,
               (r.value ->> 2)::smallint AS priority, r.value -> 3 AS payload,
               (r.value ->> 4)::timestamptz AS run_at,
               make_interval(secs => (r.value ->> 5)::float8) AS delay,
               r.value ->> 6 AS fair_key, r.ord
        FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS r(value, ord)
    ),
    inserted AS (
        INSERT INTO {table}
            (kind, queue, priority, state, payload, fair_key, trace_context, attempt,
             failures, run_at, enqueued_at, claimed_by, last_error)
        SELECT kind, queue, priority, %s, payload, fair_key, %s::jsonb, 0, 0,
               coalesce(run_at, now() + coalesce(delay, interval '0')), now(), '', ''
        FROM rows ORDER BY ord
        RETURNING id, run_at, enqueued_at
    )
    SELECT id, run_at, enqueued_at FROM inserted
    ORDER BY id
"""


def _trace_parameter(context: dict[str, str] | None) -> str | None:
    """A trace context as the statements take it: jsonb text, or NULL."""
    return None if context is None else json.dumps(context)


def _rows_document(new_jobs: Sequence[NewJob]) -> str:
    return json.dumps([_row(job) for job in new_jobs], separators=(",", ":"))


def _row(job: NewJob) -> list[Any]:
    row = [
        job.kind,
        job.queue,
        job.priority,
        job.payload,
        None if job.run_at is None else job.run_at.isoformat(),
        None if job.delay is None else job.delay.total_seconds(),
    ]
    if job.fair_key is not None:
        row.append(job.fair_key)
    return row


def _insert_orm(alias: str, new_jobs: Sequence[NewJob]) -> list[Job]:
    # Without database-side now() in bulk inserts, SQLite uses this host's clock,
    # which is the database's clock too: SQLite is single-host by nature.
    now = timezone.now()
    objects = [
        Job(
            kind=job.kind,
            queue=job.queue,
            priority=job.priority,
            state=State.READY,
            payload=job.payload,
            dedup_key=job.dedup_key,
            fair_key=job.fair_key,
            trace_context=job.trace_context,
            run_at=job.run_at or now + (job.delay or timedelta(0)),
            enqueued_at=now,
        )
        for job in new_jobs
    ]
    return Job.objects.using(alias).bulk_create(objects)


_INSERT_KEYED_SQL = """
    WITH inserted AS (
        INSERT INTO {table}
            (kind, queue, priority, state, payload, dedup_key, fair_key, trace_context,
             attempt, failures, run_at, enqueued_at, claimed_by, last_error)
        VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s, %s::jsonb, 0, 0,
                coalesce(%s::timestamptz, now() + coalesce(%s::interval, interval '0')),
                now(), '', '')
        -- The arbiter is the partial unique index on ready jobs of a key.
        ON CONFLICT (kind, dedup_key) WHERE state = 'ready' AND dedup_key IS NOT NULL
        DO NOTHING
        RETURNING id, run_at, enqueued_at
    )
    SELECT id, run_at, enqueued_at FROM inserted
"""


def insert_keyed(alias: str, new_job: NewJob) -> Job | None:
    """Insert one job with a dedup key; None if a ready job of its key is in the way."""
    if connections[alias].vendor != "postgresql":
        # SQLite: the caller's IMMEDIATE transaction holds the write lock and has
        # just seen no ready job of this key, so nothing can be in the way.
        (job,) = _insert_orm(alias, [new_job])
        return job
    sql = _on_job_table(alias, _INSERT_KEYED_SQL)
    params = [
        new_job.kind,
        new_job.queue,
        new_job.priority,
        State.READY.value,
        json.dumps(new_job.payload),
        new_job.dedup_key,
        new_job.fair_key,
        _trace_parameter(new_job.trace_context),
        new_job.run_at,
        new_job.delay,
    ]
    rows = statements.fetch(alias, sql, params)
    if not rows:
        return None
    row = rows[0]
    return _loaded(alias, new_job, row)


def _loaded(alias: str, new_job: NewJob, row: Sequence[Any]) -> Job:
    """The `Job` of a row just inserted: see `_loaded_many`."""
    (job,) = _loaded_many(alias, [new_job], [row])
    return job


def _loaded_many(alias: str, new_jobs: Sequence[NewJob], rows: Sequence[Any]) -> list[Job]:
    """The `Job`s of rows just inserted, built from what we sent and what came back
    (each row: id, run_at, enqueued_at), without a query (`inserted_jobs.py`)."""
    return inserted_jobs.loaded(
        alias,
        [
            {
                "id": row[0],
                "run_at": row[1],
                "enqueued_at": row[2],
                "kind": new_job.kind,
                "queue": new_job.queue,
                "priority": new_job.priority,
                "state": State.READY,
                "payload": new_job.payload,
                "dedup_key": new_job.dedup_key,
                "fair_key": new_job.fair_key,
                "trace_context": new_job.trace_context,
                "merged_count": 0,
            }
            for new_job, row in zip(new_jobs, rows, strict=True)
        ],
    )
