"""Periodic ticks in the database: each due tick of a schedule enqueued exactly once.

A tick is recorded in `PeriodicTick` (one row per kind) by the statement
(PostgreSQL) or the IMMEDIATE transaction (SQLite) that inserts its job, and the
row outlives the job: however many workers pass at once, and whenever cleanup
deletes the job, a tick is one job. The schedules are `periodic.py`; the
worker's passes over them are `worker/scheduler.py`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction

from django_venturi.conf import venturi_settings
from django_venturi.states import State
from django_venturi.store.clock import database_time

if TYPE_CHECKING:
    from django_venturi.enqueue import NewJob


def enqueue_tick(alias: str, new: NewJob, tick: datetime) -> int | None:
    """Record the tick and insert its prepared job in one transaction; return the job's id.

    None when the kind's recorded tick is this one or a later one (another worker
    handled it, or it was enqueued and its job cleaned up since), or when the
    insert meets a conflict: a ready job of the task's dedup key is in the way (the
    tick is recorded all the same), or the tick's job is there from before ticks
    were recorded.
    """
    if connections[alias].vendor != "postgresql":
        return _enqueue_tick_sqlite(alias, new, tick)
    return _enqueue_tick_postgresql(alias, new, tick)


def skip_tick(alias: str, kind: str, tick: datetime) -> bool:
    """Record a tick that gets no job (its schedule is disabled, or its catch-up refuses it).

    False when the kind's recorded tick is this one or a later one already.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        with transaction.atomic(using=alias):
            if not _later_than_recorded(alias, kind, tick):
                return False
            _record(alias, kind, tick, job_id=None)
            return True
    with connection.cursor() as cursor:
        cursor.execute(_SKIP_TICK_SQL.format(**_tables(alias)), [kind, tick])
        return cursor.fetchone() is not None


def _tables(alias: str) -> dict[str, str]:
    from django_venturi.models import Job, PeriodicTick

    quote = connections[alias].ops.quote_name
    return {"jobs": quote(Job._meta.db_table), "ticks": quote(PeriodicTick._meta.db_table)}


def _enqueue_tick_postgresql(alias: str, new: NewJob, tick: datetime) -> int | None:
    tables = _tables(alias)
    params: list[Any] = [
        tables["jobs"],
        new.kind,
        tick,
        new.kind,
        new.queue,
        new.priority,
        State.READY.value,
        json.dumps(new.payload),
        new.dedup_key,
        new.fair_key,
        tick,
        tick,
        venturi_settings.NOTIFY_CHANNEL,
    ]
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(_ENQUEUE_TICK_SQL.format(**tables), params)
        row = cursor.fetchone()
        if row is None:
            return None  # the kind's recorded tick is this one or a later one
        if row[1] is None:
            # The insert met a conflict: record the job that holds the tick, if any,
            # rather than the id of a job that was never inserted.
            cursor.execute(_HOLDER_SQL.format(**tables), [new.kind, tick, new.kind])
            return None
    return int(row[1])


def _enqueue_tick_sqlite(alias: str, new: NewJob, tick: datetime) -> int | None:
    from django_venturi.models import Job

    jobs = Job.objects.using(alias)
    # SQLite: the IMMEDIATE transaction holds the write lock from its first
    # statement, so nobody records or inserts the tick between these checks and the writes.
    with transaction.atomic(using=alias):
        if not _later_than_recorded(alias, new.kind, tick):
            return None
        holder = jobs.filter(kind=new.kind, periodic_tick=tick).values_list("id", flat=True)
        job_id = holder.first()
        if job_id is not None:  # enqueued before ticks were recorded
            _record(alias, new.kind, tick, job_id=job_id)
            return None
        try:
            with transaction.atomic(using=alias):
                job = jobs.create(
                    kind=new.kind,
                    queue=new.queue,
                    priority=new.priority,
                    state=State.READY,
                    payload=new.payload,
                    dedup_key=new.dedup_key,
                    fair_key=new.fair_key,
                    run_at=tick,
                    enqueued_at=database_time(alias),
                    periodic_tick=tick,
                )
        except IntegrityError:
            _record(alias, new.kind, tick, job_id=None)
            return None  # a ready job of the task's dedup key is in the way
        _record(alias, new.kind, tick, job_id=int(job.pk))
    return int(job.pk)


def _later_than_recorded(alias: str, kind: str, tick: datetime) -> bool:
    from django_venturi.models import PeriodicTick

    return not PeriodicTick.objects.using(alias).filter(kind=kind, tick__gte=tick).exists()


def _record(alias: str, kind: str, tick: datetime, *, job_id: int | None) -> None:
    """Record the kind's latest tick (SQLite, in the transaction that checked it)."""
    from django_venturi.models import PeriodicTick

    PeriodicTick.objects.using(alias).update_or_create(
        kind=kind,
        defaults={"tick": tick, "job_id": job_id, "handled_at": database_time(alias)},
    )


_ENQUEUE_TICK_SQL = """
    WITH new_job AS (
        -- The job's id, drawn first, so the tick's row can name the job it inserts.
        SELECT nextval(pg_get_serial_sequence(%s, 'id')) AS id
    ), recorded AS (
        -- Record the tick only if it is later than the kind's recorded one: the row
        -- outlives the job, so a tick whose job was cleaned up is not enqueued again.
        -- A worker recording the same tick at the same moment waits for this row's
        -- lock, then finds the tick no longer later: nothing to do.
        INSERT INTO {ticks} AS latest (kind, tick, job_id, handled_at)
        SELECT %s, %s, id, now() FROM new_job
        ON CONFLICT (kind) DO UPDATE
            SET tick = excluded.tick, job_id = excluded.job_id, handled_at = excluded.handled_at
            WHERE latest.tick < excluded.tick
        RETURNING job_id
    ), inserted AS (
        -- The job, only if the tick was recorded. A ready job of the task's dedup key
        -- in the way, or the tick's job from before ticks were recorded: no insert.
        INSERT INTO {jobs}
            (id, kind, queue, priority, state, payload, dedup_key, fair_key, attempt,
             failures, run_at, enqueued_at, claimed_by, last_error, periodic_tick)
        SELECT job_id, %s, %s, %s, %s, %s::jsonb, %s, %s, 0, 0, %s, now(), '', '', %s
        FROM recorded
        ON CONFLICT DO NOTHING
        RETURNING id, queue
    )
    SELECT recorded.job_id, inserted.id,
           CASE WHEN inserted.id IS NOT NULL THEN pg_notify(%s, inserted.queue) END
    FROM recorded LEFT JOIN inserted ON true
"""

_HOLDER_SQL = """
    UPDATE {ticks} SET job_id = (
        SELECT id FROM {jobs} WHERE kind = %s AND periodic_tick = %s
    )
    WHERE kind = %s
"""

_SKIP_TICK_SQL = """
    INSERT INTO {ticks} AS latest (kind, tick, job_id, handled_at)
    VALUES (%s, %s, NULL, now())
    ON CONFLICT (kind) DO UPDATE
        SET tick = excluded.tick, job_id = NULL, handled_at = excluded.handled_at
        WHERE latest.tick < excluded.tick
    RETURNING kind
"""
