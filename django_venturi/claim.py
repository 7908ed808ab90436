"""The claim: take due ready jobs, mark them running under a fresh lease.

On PostgreSQL this is one statement (one round trip, atomic, no retry loop).
On SQLite the same selection runs inside an IMMEDIATE transaction, which holds
the database's write lock from its first statement, so claims serialise.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from django_venturi.models import Job
from django_venturi.scheduling import TIERS, TierClock
from django_venturi.states import State


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this worker now holds, as the claim returned it."""

    id: int
    kind: str
    queue: str
    priority: int
    payload: Any
    carry: Any
    attempt: int
    """Runs started, this one included."""
    failures: int
    enqueued_at: datetime
    started_at: datetime
    """Database time of this claim."""
    claim_token: uuid.UUID
    lease: timedelta


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What one claim may take."""

    worker: str
    limit: int
    kinds: Sequence[str]
    leases: Sequence[timedelta]
    """The lease of each kind, in `kinds` order."""
    queues: Sequence[str] | None
    """None: every queue."""


def claim(alias: str, request: ClaimRequest, clock: TierClock) -> list[ClaimedJob]:
    """Claim up to `request.limit` due jobs, weighted across priority tiers."""
    if request.limit < 1 or not request.kinds:
        return []
    token = uuid.uuid4()
    if connections[alias].vendor == "postgresql":
        jobs = _claim_postgresql(alias, request, clock, token)
    else:
        jobs = _claim_orm(alias, request, clock, token)
    clock.record((job.priority for job in jobs), limit=request.limit)
    return jobs


_SERVED_QUEUES_LISTED = "SELECT unnest(%(queues)s::text[])"

# Every queue with ready jobs, found by skipping through the claim index from one
# distinct queue to the next (one index probe per queue, not a scan of the backlog).
_SERVED_QUEUES_ALL = """
    (SELECT queue FROM {table} WHERE state = 'ready' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {table} AS j
            WHERE j.state = 'ready' AND j.queue > served.queue
            ORDER BY j.queue LIMIT 1)
    FROM served WHERE served.queue IS NOT NULL
"""

_CLAIM_SQL = """
WITH RECURSIVE
served(queue) AS ({served}),
tiers(priority, clock, stride) AS (
    SELECT * FROM unnest(%(tiers)s::smallint[], %(clocks)s::float8[], %(strides)s::float8[])
),
-- For each served queue and tier, the due jobs in claim order. Each lateral
-- scan is a range of the partial claim index (queue, priority, run_at, id), so
-- its cost does not grow with the backlog. SKIP LOCKED passes over rows that
-- another worker is claiming right now instead of waiting for it.
pool AS (
    SELECT c.id, c.priority, c.run_at, tiers.clock, tiers.stride
    FROM served
    CROSS JOIN tiers
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {table}
        WHERE state = 'ready' AND queue = served.queue AND priority = tiers.priority
          AND run_at <= now() AND kind = ANY(%(kinds)s::text[])
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE served.queue IS NOT NULL
),
-- Weighted turns: the k-th candidate of a tier comes at clock + k * stride.
chosen AS (
    SELECT id FROM (
        SELECT id, priority,
               clock + stride * row_number() OVER (PARTITION BY priority ORDER BY run_at, id)
                   AS turn
        FROM pool
    ) AS ranked
    ORDER BY turn, priority
    LIMIT %(limit)s
),
leases(kind, seconds) AS (
    SELECT * FROM unnest(%(kinds)s::text[], %(lease_seconds)s::float8[])
)
UPDATE {table} AS job
SET state = 'running',
    attempt = job.attempt + 1,
    claim_token = %(token)s,
    claimed_by = %(worker)s,
    started_at = now(),
    lease_expires_at = now() + make_interval(secs => leases.seconds)
FROM chosen, leases
WHERE job.id = chosen.id AND leases.kind = job.kind
RETURNING job.id, job.kind, job.queue, job.priority, job.payload, job.carry, job.attempt,
          job.failures, job.enqueued_at, job.started_at, leases.seconds
"""


def _claim_postgresql(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> list[ClaimedJob]:
    connection = connections[alias]
    table = connection.ops.quote_name(Job._meta.db_table)
    served = _SERVED_QUEUES_ALL if request.queues is None else _SERVED_QUEUES_LISTED
    sql = _CLAIM_SQL.format(served=served.format(table=table), table=table)
    params = {
        "queues": list(request.queues or []),
        "tiers": list(TIERS),
        "clocks": clock.offsets(),
        "strides": clock.strides,
        "kinds": list(request.kinds),
        "lease_seconds": [lease.total_seconds() for lease in request.leases],
        "limit": request.limit,
        "token": token,
        "worker": request.worker,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)  # type: ignore[arg-type] # arrays are fine for psycopg
        rows = cursor.fetchall()
    jobs = [
        ClaimedJob(
            id=row[0],
            kind=row[1],
            queue=row[2],
            priority=row[3],
            payload=_json(row[4]),
            carry=_json(row[5]),
            attempt=row[6],
            failures=row[7],
            enqueued_at=row[8],
            started_at=row[9],
            claim_token=token,
            lease=timedelta(seconds=row[10]),
        )
        for row in rows
    ]
    return sorted(jobs, key=lambda job: job.id)


def _json(value: Any) -> Any:
    # Raw cursors return jsonb already decoded by psycopg; text if a caller cast it.
    if isinstance(value, str):
        return json.loads(value)
    return value


def _claim_orm(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> list[ClaimedJob]:
    lease_of = dict(zip(request.kinds, request.leases, strict=True))
    with transaction.atomic(using=alias):
        now = timezone.now()
        due = Job.objects.using(alias).filter(
            state=State.READY, run_at__lte=now, kind__in=list(request.kinds)
        )
        if request.queues is not None:
            due = due.filter(queue__in=list(request.queues))
        candidates: list[tuple[float, int, int]] = []
        for tier in TIERS:
            ids = list(
                due.filter(priority=tier)
                .order_by("run_at", "id")
                .values_list("id", flat=True)[: request.limit]
            )
            turns = clock.turns(tier, len(ids))
            candidates.extend((turn, tier, job_id) for turn, job_id in zip(turns, ids, strict=True))
        chosen = [job_id for _, _, job_id in sorted(candidates)[: request.limit]]
        jobs = list(Job.objects.using(alias).filter(id__in=chosen).order_by("id"))
        for kind in {job.kind for job in jobs}:
            Job.objects.using(alias).filter(id__in=chosen, kind=kind).update(
                state=State.RUNNING,
                attempt=F("attempt") + 1,
                claim_token=token,
                claimed_by=request.worker,
                started_at=now,
                lease_expires_at=now + lease_of[kind],
            )
    return [
        ClaimedJob(
            id=job.id,
            kind=job.kind,
            queue=job.queue,
            priority=job.priority,
            payload=job.payload,
            carry=job.carry,
            attempt=job.attempt + 1,
            failures=job.failures,
            enqueued_at=job.enqueued_at,
            started_at=now,
            claim_token=token,
            lease=lease_of[job.kind],
        )
        for job in jobs
    ]
