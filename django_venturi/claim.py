"""The claim: take due ready jobs, mark them running under a fresh lease.

On PostgreSQL this is one statement (one round trip, atomic, no retry loop);
when a claimable kind has a global concurrency cap, the statement runs in a
short transaction behind one advisory lock, so that concurrent claims count
each other's running jobs. On SQLite the same selection runs inside an
IMMEDIATE transaction, which holds the database's write lock from its first
statement, so claims serialise.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, Exists, F, Min, OuterRef, Q
from django.utils import timezone

from django_venturi.models import Job
from django_venturi.scheduling import TIERS, TierClock
from django_venturi.states import State

CAPS_LOCK_KEY = 0x76656E7475726901
"""The advisory lock that serialises claims of capped kinds (per database)."""


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

    @classmethod
    def from_row(
        cls,
        job: Job,
        *,
        attempt: int,
        started_at: datetime,
        claim_token: uuid.UUID,
        lease: timedelta,
    ) -> ClaimedJob:
        """A claimed job built from a `Job` row and the claim's own values."""
        return cls(
            id=job.id,
            kind=job.kind,
            queue=job.queue,
            priority=job.priority,
            payload=job.payload,
            carry=job.carry,
            attempt=attempt,
            failures=job.failures,
            enqueued_at=job.enqueued_at,
            started_at=started_at,
            claim_token=claim_token,
            lease=lease,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class KindLimit:
    """How many more jobs of one kind a claim may take."""

    kind: str
    global_cap: int | None
    """The task's `concurrency=`: running jobs of the kind across all workers."""
    local_room: int | None
    """What this worker's `--kind-concurrency` still allows."""


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
    limits: Sequence[KindLimit] = ()
    """Caps on some kinds; kinds not listed are unlimited."""


def claim(alias: str, request: ClaimRequest, clock: TierClock) -> list[ClaimedJob]:
    """Claim up to `request.limit` due jobs, weighted across priority tiers."""
    request = _without_full_kinds(request)
    if request.limit < 1 or not request.kinds:
        return []
    token = uuid.uuid4()
    if connections[alias].vendor == "postgresql":
        jobs = _claim_postgresql(alias, request, clock, token)
    else:
        jobs = _claim_orm(alias, request, clock, token)
    clock.record((job.priority for job in jobs), limit=request.limit)
    return jobs


def _without_full_kinds(request: ClaimRequest) -> ClaimRequest:
    """Drop the kinds this worker's local caps leave no room for."""
    full = {
        limit.kind
        for limit in request.limits
        if limit.local_room is not None and limit.local_room < 1
    }
    if not full:
        return request
    kept = [(kind, lease) for kind, lease in zip(request.kinds, request.leases, strict=True)]
    kept = [(kind, lease) for kind, lease in kept if kind not in full]
    return dataclasses.replace(
        request,
        kinds=[kind for kind, _ in kept],
        leases=[lease for _, lease in kept],
        limits=[limit for limit in request.limits if limit.kind not in full],
    )


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
-- Room left under each capped kind. Counting here is exact because claims of
-- capped kinds hold the caps advisory lock, taken before this statement began.
room(kind, room) AS (
    SELECT limits.kind,
           least(limits.local_room,
                 limits.global_cap - (SELECT count(*) FROM {table} AS running
                                      WHERE running.state = 'running'
                                        AND running.kind = limits.kind))
    FROM unnest(%(limit_kinds)s::text[], %(global_caps)s::integer[], %(local_rooms)s::integer[])
        AS limits(kind, global_cap, local_room)
),
-- Kinds at their cap are left out of the scan, so they never crowd out others.
eligible(kinds) AS (
    SELECT coalesce(array_agg(kind), '{{}}') FROM unnest(%(kinds)s::text[]) AS known(kind)
    WHERE NOT EXISTS (SELECT 1 FROM room WHERE room.kind = known.kind AND room.room < 1)
),
-- For each served queue and tier, the due jobs in claim order. Each lateral
-- scan is a range of the partial claim index (queue, priority, run_at, id), so
-- its cost does not grow with the backlog. SKIP LOCKED passes over rows that
-- another worker is claiming right now instead of waiting for it.
pool AS (
    SELECT c.id, c.kind, c.priority, c.run_at, tiers.clock, tiers.stride
    FROM served
    CROSS JOIN tiers
    CROSS JOIN LATERAL (
        SELECT id, kind, priority, run_at FROM {table}
        WHERE state = 'ready' AND queue = served.queue AND priority = tiers.priority
          AND run_at <= now() AND kind = ANY((SELECT kinds FROM eligible)::text[])
          -- A dedup follow-up waits behind the running job of its key.
          AND (dedup_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM {table} AS ahead
                WHERE ahead.state = 'running' AND ahead.kind = {table}.kind
                  AND ahead.dedup_key = {table}.dedup_key))
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE served.queue IS NOT NULL
),
-- Weighted turns: the k-th candidate of a tier comes at clock + k * stride.
ranked AS (
    SELECT id, kind, priority,
           clock + stride * row_number() OVER (PARTITION BY priority ORDER BY run_at, id) AS turn
    FROM pool
),
-- A capped kind contributes no more candidates than its room.
capped AS (
    SELECT id, priority, turn, kind,
           row_number() OVER (PARTITION BY kind ORDER BY turn, priority) AS kind_rank
    FROM ranked
),
chosen AS (
    SELECT capped.id FROM capped LEFT JOIN room ON room.kind = capped.kind
    WHERE room.room IS NULL OR capped.kind_rank <= room.room
    ORDER BY capped.turn, capped.priority
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
FROM leases
-- = ANY(ARRAY(...)) makes the planner fetch the chosen rows by primary key
-- instead of hash-joining a scan of the whole table, whatever its estimates.
WHERE job.id = ANY(ARRAY(SELECT id FROM chosen)) AND leases.kind = job.kind
RETURNING job.id, job.kind, job.queue, job.priority, job.payload, job.carry, job.attempt,
          job.failures, job.enqueued_at, job.started_at, leases.seconds
"""


def postgresql_statement(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> tuple[str, dict[str, Any]]:
    """The claim statement and its parameters (for the claim, and for EXPLAIN)."""
    table = connections[alias].ops.quote_name(Job._meta.db_table)
    served = _SERVED_QUEUES_ALL if request.queues is None else _SERVED_QUEUES_LISTED
    sql = _CLAIM_SQL.format(served=served.format(table=table), table=table)
    params = {
        "queues": list(request.queues or []),
        "tiers": list(TIERS),
        "clocks": clock.offsets(),
        "strides": clock.strides,
        "kinds": list(request.kinds),
        "lease_seconds": [lease.total_seconds() for lease in request.leases],
        "limit_kinds": [limit.kind for limit in request.limits],
        "global_caps": [limit.global_cap for limit in request.limits],
        "local_rooms": [limit.local_room for limit in request.limits],
        "limit": request.limit,
        "token": token,
        "worker": request.worker,
    }
    return sql, params


def _claim_postgresql(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> list[ClaimedJob]:
    connection = connections[alias]
    sql, params = postgresql_statement(alias, request, clock, token)
    globally_capped = any(limit.global_cap is not None for limit in request.limits)
    in_transaction = transaction.atomic(using=alias) if globally_capped else nullcontext()
    with in_transaction, connection.cursor() as cursor:
        if globally_capped:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CAPS_LOCK_KEY])
        cursor.execute(sql, params)
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
        room = _room_orm(alias, request.limits)
        kinds = [kind for kind in request.kinds if room.get(kind, 1) > 0]
        running_same_key = Job.objects.using(alias).filter(
            state=State.RUNNING, kind=OuterRef("kind"), dedup_key=OuterRef("dedup_key")
        )
        due = (
            Job.objects.using(alias)
            .filter(state=State.READY, run_at__lte=now, kind__in=kinds)
            .exclude(Q(dedup_key__isnull=False) & Exists(running_same_key))
        )
        if request.queues is not None:
            due = due.filter(queue__in=list(request.queues))
        candidates: list[tuple[float, int, int, str]] = []
        for tier in TIERS:
            rows = list(
                due.filter(priority=tier)
                .order_by("run_at", "id")
                .values_list("id", "kind")[: request.limit]
            )
            turns = clock.turns(tier, len(rows))
            candidates.extend(
                (turn, tier, job_id, kind) for turn, (job_id, kind) in zip(turns, rows, strict=True)
            )
        chosen: list[int] = []
        for _, _, job_id, kind in sorted(candidates):
            if len(chosen) == request.limit:
                break
            if kind in room:
                if room[kind] < 1:
                    continue
                room[kind] -= 1
            chosen.append(job_id)
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
        ClaimedJob.from_row(
            job,
            attempt=job.attempt + 1,
            started_at=now,
            claim_token=token,
            lease=lease_of[job.kind],
        )
        for job in jobs
    ]


def _room_orm(alias: str, limits: Sequence[KindLimit]) -> dict[str, int]:
    if not limits:
        return {}
    running = dict(
        Job.objects.using(alias)
        .filter(state=State.RUNNING, kind__in=[limit.kind for limit in limits])
        .values_list("kind")
        .annotate(count=Count("id"))
        .values_list("kind", "count")
    )
    room: dict[str, int] = {}
    for limit in limits:
        options = [limit.local_room] if limit.local_room is not None else []
        if limit.global_cap is not None:
            options.append(limit.global_cap - running.get(limit.kind, 0))
        room[limit.kind] = min(options)
    return room


_NEXT_DUE_SQL = """
WITH RECURSIVE served(queue) AS ({served})
SELECT extract(epoch FROM min(upcoming.run_at) - now())
FROM served
CROSS JOIN unnest(%(tiers)s::smallint[]) AS tiers(priority)
CROSS JOIN LATERAL (
    SELECT run_at FROM {table}
    WHERE state = 'ready' AND queue = served.queue AND priority = tiers.priority
      AND run_at > now() AND kind = ANY(%(kinds)s::text[])
    ORDER BY run_at
    LIMIT 1
) AS upcoming
WHERE served.queue IS NOT NULL
"""


def seconds_until_next_due(alias: str, request: ClaimRequest) -> float | None:
    """How long until the earliest job scheduled in the future becomes due, or None."""
    if not request.kinds:
        return None
    connection = connections[alias]
    if connection.vendor != "postgresql":
        upcoming = Job.objects.using(alias).filter(
            state=State.READY, run_at__gt=timezone.now(), kind__in=list(request.kinds)
        )
        if request.queues is not None:
            upcoming = upcoming.filter(queue__in=list(request.queues))
        earliest = upcoming.aggregate(earliest=Min("run_at"))["earliest"]
        return None if earliest is None else (earliest - timezone.now()).total_seconds()
    table = connection.ops.quote_name(Job._meta.db_table)
    served = _SERVED_QUEUES_ALL if request.queues is None else _SERVED_QUEUES_LISTED
    sql = _NEXT_DUE_SQL.format(served=served.format(table=table), table=table)
    params = {
        "queues": list(request.queues or []),
        "tiers": list(TIERS),
        "kinds": list(request.kinds),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)  # type: ignore[arg-type] # arrays are fine for psycopg
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])
