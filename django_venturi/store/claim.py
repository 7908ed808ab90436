"""The claim: take due ready jobs, mark them running under a fresh lease.

On PostgreSQL this is one statement (one round trip, atomic, no retry loop);
when a claimable kind has a global concurrency cap, the statement runs in a
short transaction behind one advisory lock, so that concurrent claims count
each other's running jobs. On SQLite the same selection runs inside an
IMMEDIATE transaction, which holds the database's write lock from its first
statement, so claims serialise.

This module holds the entry points: `claim` and the order it returns the jobs
in, the caps lock, the claim's session settings (`prime_claim_session`) and what
an idle claimer waits for (`upcoming`). The PostgreSQL statements' text and
builders are in `claim_statement.py`, the claim off PostgreSQL in `claim_orm.py`,
and the request and result types in `claim_types.py` (importable from here too).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

from django.db import connections, transaction

from django_venturi.payloads import stored
from django_venturi.store import statements
from django_venturi.store.claim_orm import claim_orm, upcoming_orm
from django_venturi.store.claim_statement import next_due_statement, postgresql_statement
from django_venturi.store.claim_types import (
    ClaimedJob,
    ClaimRequest,
    KindLimit,
    RunKey,
    Upcoming,
)
from django_venturi.store.scheduling import TierClock

__all__ = [
    "CAPS_LOCK_KEY",
    "ClaimRequest",
    "ClaimedJob",
    "KindLimit",
    "RunKey",
    "Upcoming",
    "claim",
    "claim_session",
    "prime_claim_session",
    "seconds_until_next_due",
    "upcoming",
]

CAPS_LOCK_KEY = 0x76656E7475726901
"""The advisory lock that serialises claims of capped and rate-limited kinds (per database)."""


def claim(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID | None = None
) -> list[ClaimedJob]:
    """Claim up to `request.limit` due jobs, weighted across priority tiers, under a
    fresh claim token (or `token`: a caller that must be able to hand back a claim
    whose answer it never got chooses it, see `leases.release_unanswered`)."""
    request = _without_full_kinds(request)
    if request.limit < 1 or not request.claims_some_kind():
        return []
    token = token or uuid.uuid4()
    if connections[alias].vendor == "postgresql":
        jobs = _claim_postgresql(alias, request, clock, token)
    else:
        jobs = claim_orm(alias, request, clock, token)
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
    # A value Python cannot read (written by SQL) becomes `Unreadable`, never an error:
    # the claim's UPDATE has committed, and the batch's other jobs must still run.
    return None if value is None else stored.read(value)


_LEASES: dict[float, timedelta] = {}


def _lease(seconds: float) -> timedelta:
    """The timedelta of a lease in seconds; the few distinct ones are made once."""
    lease = _LEASES.get(seconds)
    if lease is None:
        lease = _LEASES.setdefault(seconds, timedelta(seconds=seconds))
    return lease


def upcoming(alias: str, request: ClaimRequest) -> Upcoming:
    """When the next scheduled job becomes due, and when a rate limit has room again."""
    if not request.claims_some_kind():
        return Upcoming(None, None)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return upcoming_orm(alias, request)
    sql, params = next_due_statement(alias, request)
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
