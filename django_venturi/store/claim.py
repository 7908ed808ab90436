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
import functools
import json
import time
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

import msgspec
from django.db import connections, transaction
from django.db.models import Count, Exists, F, Min, OuterRef, Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from django_venturi.models import Job, Pause, RateStart
from django_venturi.states import State
from django_venturi.store import statements
from django_venturi.store.pauses import paused_names
from django_venturi.store.rate_limits import RateRule, key_value, next_opening
from django_venturi.store.scheduling import TIERS, TierClock

CAPS_LOCK_KEY = 0x76656E7475726901
"""The advisory lock that serialises claims of capped and rate-limited kinds (per database)."""


RunKey = tuple[int, uuid.UUID]
"""One run of a job: the job's id and the token of the claim that started it."""


@dataclasses.dataclass(slots=True)
class ClaimedJob:
    """A job this worker now holds, as the claim returned it.

    Not frozen: a frozen dataclass sets each field through `object.__setattr__`,
    and a claim builds one per job. Only `start_after` changes one, before its run
    starts."""

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
    claim_sent: float = 0.0
    """`time.monotonic()` when the claim statement was sent, after any lock it waited
    for: no earlier than the time a rate limit counts this start at."""
    has_dependents: bool = False
    """Whether jobs were enqueued after this one when it was claimed (its verdict then
    resolves them in the verdict's transaction)."""
    keyed: bool = False
    """Whether it has a dedup key: a follow-up of its key may wait for its verdict."""

    def start_after(self, waited: float) -> None:
        """Its handler starts `waited` seconds after the claim: date the run from there.

        In place: a claimed job belongs to its one run, which has not started yet.
        """
        self.started_at += timedelta(seconds=waited)

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
        claim_sent: float | None = None,
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
            claim_sent=time.monotonic() if claim_sent is None else claim_sent,
            has_dependents=job.dependents > 0,
            keyed=job.dedup_key is not None,
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
    rates: Sequence[RateRule] = ()
    """Rate limits on some kinds; the claim counts and records their starts."""
    rate_room: int | None = None
    """How many jobs of rate-limited kinds this claim may take (None: no bound).

    The worker passes its idle handler slots: a limited job starts as soon as it
    is claimed, never waits in the local buffer, so its start is the one counted."""

    def lease_of(self, kind: str) -> timedelta:
        """The lease a claimed job of `kind` gets."""
        for known, lease in zip(self.kinds, self.leases, strict=True):
            if known == kind:
                return lease
        assert self.prefix_lease is not None, f"{kind!r} is not claimable"
        return self.prefix_lease

    def claims_some_kind(self) -> bool:
        return bool(self.kinds) or self.kind_prefix is not None

    @property
    def limited(self) -> bool:
        """Whether a kind it may take is capped or rate-limited (the full claim statement;
        such a kind may take the places of other kinds' jobs in a short claim)."""
        return bool(self.limits or self.rates)

    @property
    def serialised(self) -> bool:
        """Whether the claim must hold the caps lock: it counts running jobs or starts."""
        return bool(self.rates) or any(limit.global_cap is not None for limit in self.limits)


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
    ordered = sorted(jobs, key=lambda job: job.id)
    if len({job.priority for job in ordered}) <= 1:
        return ordered  # one tier: its turns follow enqueue order
    by_tier: dict[int, list[ClaimedJob]] = {}
    for job in ordered:
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

_PAUSED = """
-- Paused queues and kinds (`pauses.py`): read by the statement itself, so a pause
-- committed before it began is never missed.
paused_queues(names) AS (
    SELECT coalesce(array_agg(name), '{{}}') FROM {pause_table} WHERE scope = 'queue'
),
paused_kinds(names) AS (
    SELECT coalesce(array_agg(name), '{{}}') FROM {pause_table} WHERE scope = 'kind'
)
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
      AND served.queue <> ALL((SELECT names FROM paused_queues)::text[])
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

_RATES = """
-- Rate-limited kinds, and the starts each one's window still counts, per key. A
-- claim of a limited kind holds the caps advisory lock, taken before this
-- statement began, so the counts are exact. `clock_timestamp()` is read once,
-- after that lock: the time the starts are recorded at.
rates(kind, cap, seconds, field) AS (
    SELECT * FROM unnest(%(rate_kinds)s::text[], %(rate_caps)s::integer[],
                         %(rate_seconds)s::float8[], %(rate_fields)s::text[])
),
clock(at) AS (SELECT clock_timestamp()),
used(kind, key, used) AS (
    SELECT counted.kind, counted.key, count(*)
    FROM rates JOIN {ledger} AS counted ON counted.kind = rates.kind
    WHERE counted.started_at > (SELECT at FROM clock) - make_interval(secs => rates.seconds)
    GROUP BY counted.kind, counted.key
),
-- Kinds and keys at their limit: their jobs are left out of the scan, so they
-- never crowd out others.
exhausted(kind, key, keyed) AS (
    SELECT used.kind, used.key, rates.field IS NOT NULL
    FROM used JOIN rates ON rates.kind = used.kind
    WHERE used.used >= rates.cap
),
keyed_exhausted(kinds) AS (
    SELECT coalesce(array_agg(DISTINCT kind), '{{}}') FROM exhausted WHERE keyed
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
{paused},
{rates},
-- Kinds at their cap, at their rate limit or paused are left out of the scan,
-- so they never crowd out others.
eligible(kinds) AS (
    SELECT coalesce(array_agg(kind), '{{}}') FROM unnest(%(kinds)s::text[]) AS known(kind)
    WHERE NOT EXISTS (SELECT 1 FROM room WHERE room.kind = known.kind AND room.room < 1)
      AND known.kind <> ALL((SELECT names FROM paused_kinds)::text[])
      AND NOT EXISTS (SELECT 1 FROM exhausted WHERE exhausted.kind = known.kind
                                                AND NOT exhausted.keyed)
      AND (%(rate_room)s::integer > 0
           OR NOT EXISTS (SELECT 1 FROM rates WHERE rates.kind = known.kind))
),
{slots},
-- For each slot, the due jobs in claim order. Each lateral scan is a range of
-- the partial claim index (queue, priority, rank, run_at, id), so its cost does
-- not grow with the backlog. SKIP LOCKED passes over rows that another worker
-- is claiming right now instead of waiting for it.
pool AS (
    SELECT c.id, c.kind, c.priority, c.rank, c.run_at, c.rate_key, tiers.clock, tiers.stride
    FROM slots
    JOIN tiers ON tiers.priority = slots.priority
    CROSS JOIN LATERAL (
        SELECT id, kind, priority, rank, run_at,
               -- The value a keyed rate limit counts this job's start under.
               CASE WHEN kind = ANY(%(keyed_kinds)s::text[])
                    THEN coalesce(payload ->> (SELECT field FROM rates
                                               WHERE rates.kind = {table}.kind), '')
                    ELSE '' END AS rate_key
        FROM {table}
        WHERE state = 'ready' AND queue = slots.queue AND priority = slots.priority
          AND rank = slots.rank AND run_at <= now()
          AND (kind = ANY((SELECT kinds FROM eligible)::text[])
               -- Django Tasks jobs, whatever their function (NULL: none).
               OR (starts_with(kind, %(kind_prefix)s::text)
                   AND kind <> ALL((SELECT names FROM paused_kinds)::text[])))
          -- A dedup follow-up waits behind the running job of its key.
          AND (dedup_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM {table} AS ahead
                WHERE ahead.state = 'running' AND ahead.kind = {table}.kind
                  AND ahead.dedup_key = {table}.dedup_key))
          -- A job whose rate-limit key is at its limit waits, out of the way.
          AND (kind <> ALL((SELECT kinds FROM keyed_exhausted)::text[]) OR NOT EXISTS (
                SELECT 1 FROM exhausted JOIN rates ON rates.kind = exhausted.kind
                WHERE exhausted.kind = {table}.kind AND exhausted.keyed
                  AND exhausted.key = coalesce({table}.payload ->> rates.field, '')))
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
),
-- Weighted turns: the k-th candidate of a tier comes at clock + k * stride.
ranked AS (
    SELECT id, kind, priority, rate_key,
           clock + stride * row_number() OVER (PARTITION BY priority ORDER BY rank, run_at, id)
               AS turn
    FROM pool
),
-- A capped kind contributes no more candidates than its room; a rate-limited
-- kind no more than each key's room and, all limited kinds together, than
-- `rate_room`.
capped AS (
    SELECT id, priority, turn, kind, rate_key,
           row_number() OVER (PARTITION BY kind ORDER BY turn, priority) AS kind_rank,
           row_number() OVER (PARTITION BY kind, rate_key ORDER BY turn, priority) AS key_rank,
           row_number() OVER (PARTITION BY kind = ANY(%(rate_kinds)s::text[])
                              ORDER BY turn, priority) AS limited_rank
    FROM ranked
),
chosen AS (
    SELECT capped.id, capped.kind, capped.rate_key, rates.kind IS NOT NULL AS limited
    FROM capped
    LEFT JOIN room ON room.kind = capped.kind
    LEFT JOIN rates ON rates.kind = capped.kind
    LEFT JOIN used ON used.kind = capped.kind AND used.key = capped.rate_key
    WHERE (room.room IS NULL OR capped.kind_rank <= room.room)
      AND (rates.kind IS NULL
           OR (capped.key_rank <= rates.cap - coalesce(used.used, 0)
               AND capped.limited_rank <= %(rate_room)s::integer))
    ORDER BY capped.turn, capped.priority
    LIMIT %(limit)s
),
-- Each start of a limited kind counts from now on; starts out of every window go.
recorded AS (
    INSERT INTO {ledger} (kind, key, started_at, job_id)
    SELECT kind, rate_key, (SELECT at FROM clock), id FROM chosen WHERE limited
),
forgotten AS (
    DELETE FROM {ledger} AS old USING rates
    WHERE old.kind = rates.kind
      AND old.started_at <= (SELECT at FROM clock) - make_interval(secs => rates.seconds)
),
{claim_tail}"""


_CLAIM_TAIL = """
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
          job.dependents > 0, job.dedup_key IS NOT NULL
"""

# The claim when no claimable kind is capped or rate-limited (the common case):
# the same selection without the CTEs that count running jobs and starts, which
# were most of the time PostgreSQL spent planning it (each call is planned for
# its own values: a claim of one job took 1.4 ms, most of a wake-up's latency).
_CLAIM_UNLIMITED_SQL = """
WITH RECURSIVE
served(queue) AS ({served}),
tiers(priority, clock, stride) AS (
    SELECT * FROM unnest(%(tiers)s::smallint[], %(clocks)s::float8[], %(strides)s::float8[])
),
{paused},
eligible(kinds) AS (
    SELECT coalesce(array_agg(kind), '{{}}') FROM unnest(%(kinds)s::text[]) AS known(kind)
    WHERE known.kind <> ALL((SELECT names FROM paused_kinds)::text[])
),
{slots},
-- As in the full claim: the due jobs of each slot in claim order, skipping rows
-- another worker is claiming right now.
pool AS (
    SELECT c.id, c.kind, c.priority, c.rank, c.run_at, tiers.clock, tiers.stride
    FROM slots
    JOIN tiers ON tiers.priority = slots.priority
    CROSS JOIN LATERAL (
        SELECT id, kind, priority, rank, run_at
        FROM {table}
        WHERE state = 'ready' AND queue = slots.queue AND priority = slots.priority
          AND rank = slots.rank AND run_at <= now()
          AND (kind = ANY((SELECT kinds FROM eligible)::text[])
               OR (starts_with(kind, %(kind_prefix)s::text)
                   AND kind <> ALL((SELECT names FROM paused_kinds)::text[])))
          AND (dedup_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM {table} AS ahead
                WHERE ahead.state = 'running' AND ahead.kind = {table}.kind
                  AND ahead.dedup_key = {table}.dedup_key))
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
),
ranked AS (
    SELECT id, kind, priority,
           clock + stride * row_number() OVER (PARTITION BY priority ORDER BY rank, run_at, id)
               AS turn
    FROM pool
),
chosen AS (
    SELECT id, kind FROM ranked
    ORDER BY turn, priority
    LIMIT %(limit)s
),
{claim_tail}"""


def _tables(alias: str) -> dict[str, str]:
    quote = connections[alias].ops.quote_name
    return {
        "table": quote(Job._meta.db_table),
        "pause_table": quote(Pause._meta.db_table),
        "ledger": quote(RateStart._meta.db_table),
    }


def _fragments(alias: str, listed_queues: bool) -> dict[str, str]:
    """The statement's shared parts, with the table names filled in."""
    tables = _tables(alias)
    served = _SERVED_QUEUES_LISTED if listed_queues else _SERVED_QUEUES_ALL
    return {
        **tables,
        "served": served.format(**tables),
        "paused": _PAUSED.format(**tables),
        "rates": _RATES.format(**tables),
        "slots": _SLOTS.format(**tables),
        "claim_tail": _CLAIM_TAIL.format(**tables),
    }


@functools.cache
def _claim_sql(alias: str, listed_queues: bool, limited: bool) -> str:
    """The claim statement: for given queues or all, with or without capped and
    rate-limited kinds (made once per shape: it is long to format)."""
    template = _CLAIM_SQL if limited else _CLAIM_UNLIMITED_SQL
    return template.format(**_fragments(alias, listed_queues))


def _rate_params(request: ClaimRequest) -> dict[str, Any]:
    return {
        "rate_kinds": [rule.kind for rule in request.rates],
        "rate_caps": [rule.limit.limit for rule in request.rates],
        "rate_seconds": [rule.limit.window_seconds for rule in request.rates],
        "rate_fields": [rule.limit.key for rule in request.rates],
        "keyed_kinds": [rule.kind for rule in request.rates if rule.limit.key is not None],
    }


def postgresql_statement(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> tuple[str, dict[str, Any]]:
    """The claim statement and its parameters (for the claim, and for EXPLAIN)."""
    sql = _claim_sql(alias, request.queues is not None, request.limited)
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
        "rate_room": request.limit if request.rate_room is None else request.rate_room,
        **_rate_params(request),
    }
    return sql, params


def _claim_postgresql(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> list[ClaimedJob]:
    sql, params = postgresql_statement(alias, request, clock, token)
    serialised = request.serialised
    if serialised:  # the SETs of the session would not outlast the transaction
        statements.prime_session(alias, claim_session(request))
    with transaction.atomic(using=alias) if serialised else nullcontext():
        if serialised:
            statements.fetch(alias, "SELECT pg_advisory_xact_lock(%s)", [CAPS_LOCK_KEY])
        # The claiming connection is the worker's own: no JIT for its statements.
        sent = time.monotonic()
        rows = statements.fetch(alias, sql, params, session=claim_session(request))
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
            lease=_lease(row[10]),
            claim_sent=sent,
            has_dependents=row[11],
            keyed=row[12],
        )
        for row in rows
    ]
    return jobs  # `claim` puts them in turn order


def prime_claim_session(alias: str, request: ClaimRequest) -> None:
    """Set the session up for this request's claim now (an idle worker does it before
    it sleeps, so that the claim of its next wake-up need not)."""
    statements.prime_session(alias, claim_session(request))


def claim_session(request: ClaimRequest) -> tuple[statements.Setting, ...]:
    """The session settings of this request's claim. The lean claim's plan follows
    from its shape (each step a range of an index, whatever the values), so it keeps
    one generic plan: 0.6 ms less per claim. The full claim, which counts running
    jobs and starts, is planned for its values each time."""
    return statements.WORKER_SESSION if request.limited else statements.CLAIM_SESSION


def _json(value: str | None) -> Any:
    # The statement casts jsonb to text, so a JSON string payload stays unambiguous.
    if value is None:
        return None
    try:
        return _decode_json(value)  # a tenth of `json.loads`' time
    except msgspec.MsgspecError:  # what it refuses and `json` reads (1e400: inf)
        return json.loads(value)


_decode_json = msgspec.json.Decoder().decode

_LEASES: dict[float, timedelta] = {}


def _lease(seconds: float) -> timedelta:
    """The timedelta of a lease in seconds; the few distinct ones are made once."""
    lease = _LEASES.get(seconds)
    if lease is None:
        lease = _LEASES.setdefault(seconds, timedelta(seconds=seconds))
    return lease


def _claim_orm(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID
) -> list[ClaimedJob]:
    with transaction.atomic(using=alias):
        sent = time.monotonic()  # inside the transaction: after the database's write lock
        now = timezone.now()
        room = _room_orm(alias, request.limits)
        paused_queues, paused_kinds = paused_names(alias)
        rates = _RatesOrm(alias, request, now)
        kinds = [
            kind
            for kind in request.kinds
            if room.get(kind, 1) > 0 and kind not in paused_kinds and rates.may_take(kind)
        ]
        running_same_key = Job.objects.using(alias).filter(
            state=State.RUNNING, kind=OuterRef("kind"), dedup_key=OuterRef("dedup_key")
        )
        due = (
            Job.objects.using(alias)
            .filter(state=State.READY, run_at__lte=now)
            .filter(_claimable_kinds(kinds, request.kind_prefix))
            .exclude(kind__in=paused_kinds)
            .exclude(queue__in=paused_queues)
            .exclude(Q(dedup_key__isnull=False) & Exists(running_same_key))
        )
        if request.queues is not None:
            due = due.filter(queue__in=list(request.queues))
        due = rates.without_full_keys(due)
        candidates: list[tuple[float, int, int, str, Any]] = []
        for tier in TIERS:
            rows = list(
                due.filter(priority=tier)
                .order_by("rank", "run_at", "id")
                .values_list("id", "kind", "payload")[: request.limit]
            )
            turns = clock.turns(tier, len(rows))
            candidates.extend(
                (turn, tier, job_id, kind, payload)
                for turn, (job_id, kind, payload) in zip(turns, rows, strict=True)
            )
        chosen: list[int] = []
        for _, _, job_id, kind, payload in sorted(candidates, key=lambda entry: entry[:3]):
            if len(chosen) == request.limit:
                break
            if room.get(kind, 1) < 1 or not rates.take(job_id, kind, payload):
                continue
            if kind in room:
                room[kind] -= 1
            chosen.append(job_id)
        rates.record()
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
            claim_sent=sent,
        )
        for job in jobs
    ]


class _RatesOrm:
    """The rate limits of one claim off PostgreSQL: what each kind and key may still
    start, the starts this claim takes, and their rows (inside the claim's transaction,
    which holds the database's write lock, so claims count each other's starts)."""

    def __init__(self, alias: str, request: ClaimRequest, now: datetime) -> None:
        self.alias = alias
        self.now = now
        self.rules = {rule.kind: rule for rule in request.rates}
        self.room = request.limit if request.rate_room is None else request.rate_room
        self.used = {rule.kind: _counted_starts(alias, rule, now) for rule in request.rates}
        self.taken: list[RateStart] = []

    def may_take(self, kind: str) -> bool:
        """False for a limited kind this claim cannot start any job of."""
        rule = self.rules.get(kind)
        if rule is None:
            return True
        if self.room < 1:
            return False
        return rule.limit.key is not None or len(self.used[kind].get("", [])) < rule.limit.limit

    def without_full_keys(self, due: QuerySet[Job]) -> QuerySet[Job]:
        """`due` less the jobs whose key is at its limit (so they fill no part of the claim)."""
        for index, (kind, rule) in enumerate(self.rules.items()):
            field = rule.limit.key
            used = self.used[kind]
            full = [key for key, starts in used.items() if len(starts) >= rule.limit.limit]
            if field is None or not full:
                continue
            name = f"venturi_rate_key_{index}"
            # Cast: a key transform's own `__in` would compare JSON, not text.
            key = Cast(KeyTextTransform(field, "payload"), output_field=TextField())
            due = due.alias(**{name: key})
            due = due.exclude(Q(kind=kind) & Q(**{f"{name}__in": full}))
        return due

    def take(self, job_id: int, kind: str, payload: Any) -> bool:
        """Count one start of a job of `kind`; False if its limit has no room."""
        rule = self.rules.get(kind)
        if rule is None:
            return True
        key = key_value(rule.limit, payload)
        starts = self.used[kind].setdefault(key, [])
        if self.room < 1 or len(starts) >= rule.limit.limit:
            return False
        self.room -= 1
        starts.append(self.now)
        self.taken.append(RateStart(kind=kind, key=key, started_at=self.now, job_id=job_id))
        return True

    def record(self) -> None:
        """Write this claim's starts; forget those out of every window."""
        RateStart.objects.using(self.alias).bulk_create(self.taken)
        for kind, rule in self.rules.items():
            window = timedelta(seconds=rule.limit.window_seconds)
            RateStart.objects.using(self.alias).filter(
                kind=kind, started_at__lte=self.now - window
            ).delete()


def _counted_starts(alias: str, rule: RateRule, now: datetime) -> dict[str, list[datetime]]:
    """The starts of `rule`'s kind that its window still counts, per key."""
    window = timedelta(seconds=rule.limit.window_seconds)
    counted: dict[str, list[datetime]] = {}
    rows = RateStart.objects.using(alias).filter(kind=rule.kind, started_at__gt=now - window)
    for key, started_at in rows.values_list("key", "started_at"):
        counted.setdefault(key, []).append(started_at)
    return counted


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
{paused},
{slots},
{rates},
-- When each kind or key at its rate limit, with due jobs waiting on it, has room
-- again: when its limit-th newest start leaves the window.
openings(at) AS (
    SELECT (array_agg(counted.started_at ORDER BY counted.started_at DESC))[min(rates.cap)]
           + make_interval(secs => min(rates.seconds))
    FROM exhausted
    JOIN rates ON rates.kind = exhausted.kind
    JOIN {ledger} AS counted ON counted.kind = exhausted.kind AND counted.key = exhausted.key
    WHERE counted.started_at > (SELECT at FROM clock) - make_interval(secs => rates.seconds)
      AND exhausted.kind <> ALL((SELECT names FROM paused_kinds)::text[])
      AND EXISTS (
        SELECT 1 FROM {table} AS waiting
        WHERE waiting.state = 'ready' AND waiting.kind = exhausted.kind
          AND waiting.run_at <= now()
          AND (rates.field IS NULL
               OR coalesce(waiting.payload ->> rates.field, '') = exhausted.key))
    GROUP BY exhausted.kind, exhausted.key
)
SELECT
    extract(epoch FROM
        (SELECT min(upcoming.run_at)
         FROM slots
         CROSS JOIN LATERAL (
            SELECT run_at FROM {table}
            WHERE state = 'ready' AND queue = slots.queue AND priority = slots.priority
              AND rank = slots.rank AND run_at > now()
              AND (kind = ANY(%(kinds)s::text[]) OR starts_with(kind, %(kind_prefix)s::text))
            ORDER BY run_at
            LIMIT 1
         ) AS upcoming) - (SELECT at FROM clock)),
    extract(epoch FROM (SELECT min(at) FROM openings) - (SELECT at FROM clock))
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Upcoming:
    """What an idle claimer waits for, in seconds from now (None: nothing)."""

    scheduled: float | None
    """The earliest job scheduled in the future becomes due."""
    rate_opening: float | None
    """A rate-limited kind (or key) with due jobs waiting on it has room again."""

    @property
    def soonest(self) -> float | None:
        known = [seconds for seconds in (self.scheduled, self.rate_opening) if seconds is not None]
        return min(known, default=None)


def upcoming(alias: str, request: ClaimRequest) -> Upcoming:
    """When the next scheduled job becomes due, and when a rate limit has room again."""
    if not request.claims_some_kind():
        return Upcoming(None, None)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return _upcoming_orm(alias, request)
    sql = _NEXT_DUE_SQL.format(**_fragments(alias, request.queues is not None))
    params = {
        "queues": list(request.queues or []),
        "kinds": list(request.kinds),
        "kind_prefix": request.kind_prefix,
        **_rate_params(request),
    }
    rows = statements.fetch(alias, sql, params, session=statements.WORKER_SESSION)
    scheduled, opening = rows[0] if rows else (None, None)
    return Upcoming(
        None if scheduled is None else float(scheduled),
        None if opening is None else float(opening),
    )


def seconds_until_next_due(alias: str, request: ClaimRequest) -> float | None:
    """How long until a job scheduled in the future becomes due, or a rate-limited kind
    (or key) with due jobs has room again, whichever comes first; None if neither."""
    return upcoming(alias, request).soonest


def _upcoming_orm(alias: str, request: ClaimRequest) -> Upcoming:
    now = timezone.now()
    scheduled = (
        Job.objects.using(alias)
        .filter(state=State.READY, run_at__gt=now)
        .filter(_claimable_kinds(request.kinds, request.kind_prefix))
    )
    if request.queues is not None:
        scheduled = scheduled.filter(queue__in=list(request.queues))
    earliest = scheduled.aggregate(earliest=Min("run_at"))["earliest"]
    _, paused_kinds = paused_names(alias)
    openings = []
    for rule in request.rates:
        if rule.kind in paused_kinds:
            continue
        waiting = {
            key_value(rule.limit, payload)
            for payload in Job.objects.using(alias)
            .filter(state=State.READY, kind=rule.kind, run_at__lte=now)
            .values_list("payload", flat=True)
        }
        for key, starts in _counted_starts(alias, rule, now).items():
            opening = next_opening(starts, rule.limit, now)
            if opening is not None and key in waiting:
                openings.append(opening)
    soonest = min(openings, default=None)
    return Upcoming(
        None if earliest is None else (earliest - now).total_seconds(),
        None if soonest is None else (soonest - now).total_seconds(),
    )
