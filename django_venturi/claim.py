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

from django_venturi import statements
from django_venturi.models import Job
from django_venturi.scheduling import TIERS, TierClock
from django_venturi.states import State

CAPS_LOCK_KEY = 0x76656E7475726901
"""The advisory lock that serialises claims of capped kinds (per database)."""


RunKey = tuple[int, uuid.UUID]
"""One run of a job: the job's id and the token of the claim that started it."""


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
    has_dependents: bool = False
    """Whether jobs were enqueued after this one when it was claimed (its verdict then
    resolves them in the verdict's transaction)."""

    @property
    def run_key(self) -> RunKey:
        """This run's identity: a job claimed twice by one worker has two runs."""
        return (self.id, self.claim_token)

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
            has_dependents=job.dependents > 0,
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
    kind_prefix: str | None = None
    """Also claim every kind that starts with this (Django Tasks jobs, see `backend.py`)."""
    prefix_lease: timedelta | None = None
    """The lease of the jobs claimed through `kind_prefix`."""

    def lease_of(self, kind: str) -> timedelta:
        """The lease a claimed job of `kind` gets."""
        for known, lease in zip(self.kinds, self.leases, strict=True):
            if known == kind:
                return lease
        assert self.prefix_lease is not None, f"{kind!r} is not claimable"
        return self.prefix_lease

    def claims_some_kind(self) -> bool:
        return bool(self.kinds) or self.kind_prefix is not None


def claim(alias: str, request: ClaimRequest, clock: TierClock) -> list[ClaimedJob]:
    """Claim up to `request.limit` due jobs, weighted across priority tiers."""
    request = _without_full_kinds(request)
    if request.limit < 1 or not request.claims_some_kind():
        return []
    token = uuid.uuid4()
    if connections[alias].vendor == "postgresql":
        jobs = _claim_postgresql(alias, request, clock, token)
    else:
        jobs = _claim_orm(alias, request, clock, token)
    jobs = _in_turn_order(jobs, clock)
    clock.record((job.priority for job in jobs), limit=request.limit)
    return jobs


def _in_turn_order(jobs: list[ClaimedJob], clock: TierClock) -> list[ClaimedJob]:
    """The jobs in the order of their weighted turns (enqueue order within a tier).

    A worker runs a batch in the order given; with large batches (short jobs,
    deep buffer) enqueue order would run all of a batch's HIGH jobs before its
    LOW ones, while the turns interleave the tiers 6:3:1 as the claim chose them.
    """
    by_tier: dict[int, list[ClaimedJob]] = {}
    for job in sorted(jobs, key=lambda job: job.id):
        by_tier.setdefault(job.priority, []).append(job)
    turns = [
        (turn, tier, job.id, job)
        for tier, group in by_tier.items()
        for turn, job in zip(clock.turns(tier, len(group)), group, strict=True)
    ]
    return [job for _, _, _, job in sorted(turns, key=lambda entry: entry[:3])]


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

_SLOTS = """
-- The (tier, rank) pairs that hold ready jobs in each served queue, found by
-- skipping through the claim index from one pair to the next: one index probe
-- per pair (usually one rank per tier), not a scan of the backlog.
slots(queue, priority, rank) AS (
    SELECT served.queue, lowest.priority, lowest.rank
    FROM served
    CROSS JOIN LATERAL (
        SELECT priority, rank FROM {table}
        WHERE state = 'ready' AND queue = served.queue
        ORDER BY priority, rank LIMIT 1
    ) AS lowest
    WHERE served.queue IS NOT NULL
    UNION ALL
    SELECT slots.queue, following.priority, following.rank
    FROM slots
    CROSS JOIN LATERAL (
        SELECT priority, rank FROM {table}
        WHERE state = 'ready' AND queue = slots.queue
          AND (priority, rank) > (slots.priority, slots.rank)
        ORDER BY priority, rank LIMIT 1
    ) AS following
)
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
{slots},
-- For each slot, the due jobs in claim order. Each lateral scan is a range of
-- the partial claim index (queue, priority, rank, run_at, id), so its cost does
-- not grow with the backlog. SKIP LOCKED passes over rows that another worker
-- is claiming right now instead of waiting for it.
pool AS (
    SELECT c.id, c.kind, c.priority, c.rank, c.run_at, tiers.clock, tiers.stride
    FROM slots
    JOIN tiers ON tiers.priority = slots.priority
    CROSS JOIN LATERAL (
        SELECT id, kind, priority, rank, run_at FROM {table}
        WHERE state = 'ready' AND queue = slots.queue AND priority = slots.priority
          AND rank = slots.rank AND run_at <= now()
          AND (kind = ANY((SELECT kinds FROM eligible)::text[])
               -- Django Tasks jobs, whatever their function (NULL: none).
               OR starts_with(kind, %(kind_prefix)s::text))
          -- A dedup follow-up waits behind the running job of its key.
          AND (dedup_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM {table} AS ahead
                WHERE ahead.state = 'running' AND ahead.kind = {table}.kind
                  AND ahead.dedup_key = {table}.dedup_key))
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
),
-- Weighted turns: the k-th candidate of a tier comes at clock + k * stride.
ranked AS (
    SELECT id, kind, priority,
           clock + stride * row_number() OVER (PARTITION BY priority ORDER BY rank, run_at, id)
               AS turn
    FROM pool
),
-- A capped kind contributes no more candidates than its room.
capped AS (
    SELECT id, priority, turn, kind,
           row_number() OVER (PARTITION BY kind ORDER BY turn, priority) AS kind_rank
    FROM ranked
),
chosen AS (
    SELECT capped.id, capped.kind FROM capped LEFT JOIN room ON room.kind = capped.kind
    WHERE room.room IS NULL OR capped.kind_rank <= room.room
    ORDER BY capped.turn, capped.priority
    LIMIT %(limit)s
),
leases(kind, seconds) AS (
    SELECT * FROM unnest(%(kinds)s::text[], %(lease_seconds)s::float8[])
),
-- Each chosen job's lease: its kind's, or the prefix lease for a Django Tasks job.
leased AS (
    SELECT chosen.id, coalesce(leases.seconds, %(prefix_lease_seconds)s::float8) AS seconds
    FROM chosen LEFT JOIN leases ON leases.kind = chosen.kind
)
UPDATE {table} AS job
SET state = 'running',
    attempt = job.attempt + 1,
    claim_token = %(token)s,
    claimed_by = %(worker)s,
    started_at = now(),
    lease_expires_at = now() + make_interval(secs => leased.seconds)
FROM leased
-- = ANY(ARRAY(...)) makes the planner fetch the chosen rows by primary key
-- instead of hash-joining a scan of the whole table, whatever its estimates.
WHERE job.id = ANY(ARRAY(SELECT id FROM leased)) AND leased.id = job.id
-- payload and carry as text: the same on either path (prepared results come in
-- binary, where psycopg would decode jsonb itself; Django's loads it as text).
RETURNING job.id, job.kind, job.queue, job.priority, job.payload::text, job.carry::text,
          job.attempt, job.failures, job.enqueued_at, job.started_at, leased.seconds,
          job.dependents > 0
"""


def postgresql_statement(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> tuple[str, dict[str, Any]]:
    """The claim statement and its parameters (for the claim, and for EXPLAIN)."""
    table = connections[alias].ops.quote_name(Job._meta.db_table)
    served = _SERVED_QUEUES_ALL if request.queues is None else _SERVED_QUEUES_LISTED
    sql = _CLAIM_SQL.format(
        served=served.format(table=table), slots=_SLOTS.format(table=table), table=table
    )
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
        "kind_prefix": request.kind_prefix,
        "prefix_lease_seconds": (
            None if request.prefix_lease is None else request.prefix_lease.total_seconds()
        ),
        "limit": request.limit,
        "token": token,
        "worker": request.worker,
    }
    return sql, params


def _claim_postgresql(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> list[ClaimedJob]:
    sql, params = postgresql_statement(alias, request, clock, token)
    globally_capped = any(limit.global_cap is not None for limit in request.limits)
    if globally_capped:  # the SETs of the session would not outlast the transaction
        statements.prime_session(alias, statements.WORKER_SESSION)
    with transaction.atomic(using=alias) if globally_capped else nullcontext():
        if globally_capped:
            statements.fetch(alias, "SELECT pg_advisory_xact_lock(%s)", [CAPS_LOCK_KEY])
        # The claiming connection is the worker's own: no JIT for its statements.
        rows = statements.fetch(alias, sql, params, session=statements.WORKER_SESSION)
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
            has_dependents=row[11],
        )
        for row in rows
    ]
    return sorted(jobs, key=lambda job: job.id)


def _json(value: str | None) -> Any:
    # The statement casts jsonb to text, so a JSON string payload stays unambiguous.
    return None if value is None else json.loads(value)


def _claim_orm(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> list[ClaimedJob]:
    with transaction.atomic(using=alias):
        now = timezone.now()
        room = _room_orm(alias, request.limits)
        kinds = [kind for kind in request.kinds if room.get(kind, 1) > 0]
        running_same_key = Job.objects.using(alias).filter(
            state=State.RUNNING, kind=OuterRef("kind"), dedup_key=OuterRef("dedup_key")
        )
        due = (
            Job.objects.using(alias)
            .filter(state=State.READY, run_at__lte=now)
            .filter(_claimable_kinds(kinds, request.kind_prefix))
            .exclude(Q(dedup_key__isnull=False) & Exists(running_same_key))
        )
        if request.queues is not None:
            due = due.filter(queue__in=list(request.queues))
        candidates: list[tuple[float, int, int, str]] = []
        for tier in TIERS:
            rows = list(
                due.filter(priority=tier)
                .order_by("rank", "run_at", "id")
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
                lease_expires_at=now + request.lease_of(kind),
            )
    return [
        ClaimedJob.from_row(
            job,
            attempt=job.attempt + 1,
            started_at=now,
            claim_token=token,
            lease=request.lease_of(job.kind),
        )
        for job in jobs
    ]


def _claimable_kinds(kinds: Sequence[str], prefix: str | None) -> Q:
    claimable = Q(kind__in=list(kinds))
    if prefix is not None:
        claimable |= Q(kind__startswith=prefix)
    return claimable


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
WITH RECURSIVE served(queue) AS ({served}),
{slots}
SELECT extract(epoch FROM min(upcoming.run_at) - now())
FROM slots
CROSS JOIN LATERAL (
    SELECT run_at FROM {table}
    WHERE state = 'ready' AND queue = slots.queue AND priority = slots.priority
      AND rank = slots.rank AND run_at > now()
      AND (kind = ANY(%(kinds)s::text[]) OR starts_with(kind, %(kind_prefix)s::text))
    ORDER BY run_at
    LIMIT 1
) AS upcoming
"""


def seconds_until_next_due(alias: str, request: ClaimRequest) -> float | None:
    """How long until the earliest job scheduled in the future becomes due, or None."""
    if not request.claims_some_kind():
        return None
    connection = connections[alias]
    if connection.vendor != "postgresql":
        upcoming = (
            Job.objects.using(alias)
            .filter(state=State.READY, run_at__gt=timezone.now())
            .filter(_claimable_kinds(request.kinds, request.kind_prefix))
        )
        if request.queues is not None:
            upcoming = upcoming.filter(queue__in=list(request.queues))
        earliest = upcoming.aggregate(earliest=Min("run_at"))["earliest"]
        return None if earliest is None else (earliest - timezone.now()).total_seconds()
    table = connection.ops.quote_name(Job._meta.db_table)
    served = _SERVED_QUEUES_ALL if request.queues is None else _SERVED_QUEUES_LISTED
    sql = _NEXT_DUE_SQL.format(
        served=served.format(table=table), slots=_SLOTS.format(table=table), table=table
    )
    params = {
        "queues": list(request.queues or []),
        "kinds": list(request.kinds),
        "kind_prefix": request.kind_prefix,
    }
    rows = statements.fetch(alias, sql, params, session=statements.WORKER_SESSION)
    row = rows[0] if rows else None
    return None if row is None or row[0] is None else float(row[0])
