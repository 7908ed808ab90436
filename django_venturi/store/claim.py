"""The claim: take due ready jobs, mark them running under a fresh lease.

On PostgreSQL this is one statement (one round trip, atomic, no retry loop).
When a claimable kind has a global concurrency cap or a rate limit, the
statement counts running jobs and recorded starts, and two claims must not
count at once: such a claim runs in a short transaction that first takes the
caps lock (`CAPS_LOCK_KEY`, a transaction-level advisory lock), so that its
statement, whose snapshot is taken after the lock, sees every earlier claim's
jobs. The lock's statement and the claim go in one pipeline that ends with its
Sync (`statements.fetch_pair`: one round trip, one transaction); the first tells
the second whether it took the lock (`CAPS_LOCKED`). A round trip of the claim
loop costs more than the network's time, since the thread then waits for the
interpreter's lock behind the handlers' threads: three of them instead of one
made a plain drain beside a capped kind 25 to 30 % slower. On SQLite the same
selection runs inside an IMMEDIATE transaction, which holds the database's
write lock from its first statement, so claims serialise.

No worker can hold the caps lock up for the others (issue 32). The lock is
tried, never waited for (`pg_try_advisory_xact_lock`): a claim that finds it
taken claims every other kind at once (in the same statement) and leaves the
capped and rate-limited ones to a try a few milliseconds later
(`Claimed.counted_later`), so unlimited kinds never wait behind capped ones.
The transaction commits when the claim statement ends, whatever its worker does
meanwhile: a worker frozen by SIGSTOP, a paused VM, a long GC pause or a host
gone without a word holds the lock no longer than its statement runs, and what
it claimed is its own (run when it thaws, or recovered when its lease runs
out). Should the server still wait on that worker, the transaction tells it to
give up after `CAPS_LOCK_HOLD` (set for that transaction only):
`tcp_user_timeout` while it is stuck sending the claimed rows (the worker's
socket buffers full), `lock_timeout` should the statement ever wait on a row
another session holds, and `idle_in_transaction_session_timeout` once the
transaction is idle. (A worker frozen after its first statement went out and
before the pipeline's Sync did leaves its session active, reading, where no
timeout applies: the other workers' lease sweeps end it, `stuck_claims.py`.)
The server ends that session, the claim rolls back (no job is left running
without a worker that knows it), and the worker, when it runs again, finds its
connection gone and reconnects as after any lost connection.

Measured with two workers draining no-op jobs beside a registered rate-limited
kind, one frozen for 2.5 s ten times at random moments (the issue's repro): with
the lock waited for and no bound, 3 freezes in 10 stopped the other worker for
the whole freeze; waited for under these bounds and a `lock_timeout`, it still
stopped for up to 1.9 s (every claim of every kind waits for the lock, and a
wait that runs out aborts the whole claim, unlimited kinds with it); tried, as
here, it never stopped (0.06 s at most, the sampling step), at the same drain
rate. Locking per-kind limit rows with SKIP LOCKED was not taken: the rows must
be locked before the counting statement takes its snapshot, or the counts miss
the last claim's commit, so it needs the same separate statement, the same
bound and a new table, and gains nothing here, where each worker claims every
registered kind and so would lock every row.

This module holds the entry points: `claim` and the order it returns the jobs
in, the caps lock, the claim's session settings (`prime_claim_session`) and what
an idle claimer waits for (`upcoming`). The PostgreSQL statements' text and
builders are in `claim_statement.py`, the claim off PostgreSQL in `claim_orm.py`,
and the request and result types in `claim_types.py` (importable from here too).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from datetime import timedelta
from typing import Any

from django import db
from django.db import connections

from django_venturi.models import Job
from django_venturi.payloads import stored
from django_venturi.store import statements
from django_venturi.store.claim_next_due import next_due_statement
from django_venturi.store.claim_orm import claim_orm, upcoming_orm
from django_venturi.store.claim_statement import postgresql_statement
from django_venturi.store.claim_types import (
    Claimed,
    ClaimedJob,
    ClaimRequest,
    KindLimit,
    RunKey,
    Upcoming,
)
from django_venturi.store.connections import DATABASE_ERRORS
from django_venturi.store.scheduling import TierClock

__all__ = [
    "CAPS_LOCK_HOLD",
    "CAPS_LOCK_KEY",
    "ClaimRequest",
    "ClaimSessionEnded",
    "Claimed",
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

CAPS_LOCK_HOLD = timedelta(seconds=2)
"""The longest the server lets a claim that holds the caps lock wait on its worker
(for its next statement or COMMIT, or to take the rows sent to it) before it ends
the worker's session, which rolls the claim back and frees the lock. So a frozen
or dead worker holds up other workers' claims of capped and rate-limited kinds
for at most this long (and never their claims of other kinds). A live worker
answers within milliseconds: the transaction holds no wait of its own."""

CAPS_LOCKED = "venturi.caps_locked"
"""The setting that tells the claim statement, in the transaction of the caps lock's
statement, whether that statement took the lock ('on'); else it leaves the kinds
that need it alone."""

# Beside the lock: whether a job of a kind that needs it is ready (one probe of the
# kind and state index per kind). A claim that finds the lock taken and none ready
# has left nothing for later: a job enqueued after it announces itself.
_TRY_CAPS_LOCK = """
SELECT set_config('venturi.caps_locked',
                  CASE WHEN pg_try_advisory_xact_lock(%(key)s) THEN 'on' ELSE 'off' END,
                  true) = 'on',
       EXISTS (SELECT FROM {table} WHERE state = 'ready'
                                     AND kind = ANY(%(serialised_kinds)s::text[]))"""

# The same, with the bounds of the claim's transaction (`CAPS_LOCK_HOLD`).
_TAKE_CAPS_LOCK = (
    _TRY_CAPS_LOCK
    + """,
       set_config('idle_in_transaction_session_timeout', %(hold)s, true),
       set_config('lock_timeout', %(hold)s, true),
       -- TCP_USER_TIMEOUT is Linux's; elsewhere the setting stays as it is.
       set_config('tcp_user_timeout',
                  CASE WHEN version() ILIKE '%%linux%%' THEN %(hold)s
                       ELSE current_setting('tcp_user_timeout') END, true)
"""
)


def claim(
    alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID | None = None
) -> Claimed:
    """Claim up to `request.limit` due jobs, weighted across priority tiers and the
    queues within each tier (`scheduling.py`), under a
    fresh claim token (or `token`: a caller that must be able to hand back a claim
    whose answer it never got chooses it, see `leases.release_unanswered`)."""
    whole = request
    request = _without_full_kinds(request)
    # Kinds this worker's own caps left out: their due jobs wait for its runs to finish.
    left_out = request is not whole
    if request.limit < 1 or not request.claims_some_kind():
        return Claimed(left_behind=left_out)
    token = token or uuid.uuid4()
    if connections[alias].vendor == "postgresql":
        jobs = _claim_postgresql(alias, request, clock, token)
    else:
        jobs = claim_orm(alias, request, clock, token)
    ordered = Claimed(
        _in_turn_order(jobs, clock),
        counted_later=jobs.counted_later,
        left_behind=jobs.left_behind or left_out,
        fair_cursors=jobs.fair_cursors,
    )
    clock.record(((job.priority, job.queue) for job in ordered), limit=request.limit)
    clock.advance_fair(jobs.fair_cursors)
    return ordered


def _in_turn_order(jobs: list[ClaimedJob], clock: TierClock) -> list[ClaimedJob]:
    """The jobs in the order of their weighted turns (enqueue order within a queue).

    A worker runs a batch in the order given; with large batches (short jobs,
    deep buffer) enqueue order would run all of a batch's HIGH jobs before its
    LOW ones, and an older queue's jobs before a newer one's, while the turns
    interleave the tiers 6:3:1 and the queues as the claim chose them.
    """
    ordered = sorted(jobs, key=lambda job: job.id)
    if len({(job.priority, job.queue) for job in ordered}) <= 1:
        return ordered  # one queue of one tier: its turns follow enqueue order
    by_queue: dict[tuple[int, str], list[ClaimedJob]] = {}
    for job in ordered:
        by_queue.setdefault((job.priority, job.queue), []).append(job)
    by_tier: dict[int, list[tuple[float, int, ClaimedJob]]] = {}
    for (tier, queue), group in by_queue.items():
        queue_turns = clock.queue_turns(tier, queue, len(group))
        by_tier.setdefault(tier, []).extend(
            (turn, job.id, job) for turn, job in zip(queue_turns, group, strict=True)
        )
    turns: list[tuple[float, int, int, ClaimedJob]] = []
    for tier, candidates in by_tier.items():
        candidates.sort(key=lambda entry: entry[:2])
        tier_turns = clock.turns(tier, len(candidates))
        turns.extend(
            (turn, tier, job.id, job)
            for turn, (_, _, job) in zip(tier_turns, candidates, strict=True)
        )
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
) -> Claimed:
    sql, params = postgresql_statement(alias, request, clock, token)
    session = claim_session(request)
    sent = time.monotonic()
    if not request.serialised:
        rows = statements.fetch(alias, sql, params, session=session)
        return Claimed(
            _claimed(rows, token, sent),
            left_behind=_left_behind(request, rows),
            fair_cursors=_fair_turns(rows),
        )
    # Inside a caller's transaction (a test's), the lock lasts as long as it does,
    # and the bounds would reach its later statements: left to the caller.
    bounded = not connections[alias].in_atomic_block
    lock = (
        _caps_lock_sql(alias, bounded),
        {"key": CAPS_LOCK_KEY, "hold": _HOLD, "serialised_kinds": params["serialised_kinds"]},
    )
    try:
        locked, rows = statements.fetch_pair(alias, lock, (sql, params), session=session)
    except DATABASE_ERRORS as error:
        lasted = time.monotonic() - sent
        if lasted > CAPS_LOCK_HOLD.total_seconds():
            raise ClaimSessionEnded(
                f"the claim's transaction lasted {lasted:.1f} s, past CAPS_LOCK_HOLD "
                f"({CAPS_LOCK_HOLD.total_seconds():g} s): most likely this worker was frozen "
                "or starved while it held the caps lock, and the server ended its session, "
                f"which rolled the claim back ({error})"
            ) from error
        raise
    # Another claim is counting (or its worker stopped answering, until the server
    # ends its session): the statement took the kinds that need no count, and left
    # the others, if any is ready, for a claim shortly.
    (took_lock, serialised_ready, *_settings) = locked[0]
    return Claimed(
        _claimed(rows, token, sent),
        counted_later=not took_lock and serialised_ready,
        left_behind=_left_behind(request, rows),
        fair_cursors=_fair_turns(rows),
    )


def _left_behind(request: ClaimRequest, rows: list[tuple[Any, ...]]) -> bool:
    """Whether the claim may have passed over due jobs of capped or rate-limited kinds:
    the full claim's last column (`claim_statement._LEFT_BEHIND_TAIL`), on a row of
    its own, without a job, when it took nothing: a limited claim always has a row."""
    return request.limited and bool(rows[0][-1])


_HOLD = str(int(CAPS_LOCK_HOLD.total_seconds() * 1000))


@functools.cache
def _caps_lock_sql(alias: str, bounded: bool) -> str:
    """The caps lock's statement: with its bounds, or without (inside a caller's
    transaction)."""
    table = connections[alias].ops.quote_name(Job._meta.db_table)
    return (_TAKE_CAPS_LOCK if bounded else _TRY_CAPS_LOCK).format(table=table)


class ClaimSessionEnded(db.OperationalError):
    """The server ended the session of a claim that held the caps lock: its worker did
    not answer within `CAPS_LOCK_HOLD`. Nothing was claimed; the worker reconnects."""


def _claimed(rows: list[tuple[Any, ...]], token: uuid.UUID, sent: float) -> list[ClaimedJob]:
    """The jobs of the claim statement's rows (`claim` puts them in turn order)."""
    return [
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
            fair_key=row[13],
            trace_context=_json(row[15]),
            run_at=row[16],
        )
        for row in rows
        if row[0] is not None  # the full claim's row when it took nothing
    ]


def _fair_turns(rows: list[tuple[Any, ...]]) -> dict[str, str]:
    """Per fair kind, the key of its last turn in this claim (the rows' last two columns:
    fair key, turn): where the kind's next claim starts."""
    last: dict[str, tuple[int, str]] = {}
    for row in rows:
        key, turn = row[13], row[14]
        if turn is not None and (row[1] not in last or turn > last[row[1]][0]):
            last[row[1]] = (turn, key)
    return {kind: key for kind, (_, key) in last.items()}


def prime_claim_session(alias: str, request: ClaimRequest) -> None:
    """Set the session up for this request's claim now (an idle worker does it before
    it sleeps, so that the claim of its next wake-up need not)."""
    statements.prime_session(alias, claim_session(request))


def claim_session(request: ClaimRequest) -> tuple[statements.Setting, ...]:
    """The session settings of this request's claim: one generic plan, made once per
    connection. Each claim's plan follows from its shape (every step a range of an
    index, whatever the values), and planning the full claim, which counts running
    jobs and starts, for its values took 2 ms of each claim (0.6 ms the lean one).
    A claim of fair kinds keeps its probes in the fair index (`statements.NO_SORTS`)."""
    return statements.FAIR_CLAIM_SESSION if request.fair_kinds else statements.CLAIM_SESSION


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
