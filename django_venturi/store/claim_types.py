"""The claim's request and its results: what one claim may take (`ClaimRequest`,
`KindLimit`), the jobs it took (`Claimed`, of `ClaimedJob`s, each run's `RunKey`) and
what an idle claimer waits for (`Upcoming`).

The lowest of the claim's modules: `claim.py` (the entry points, which re-export
these names), `claim_statement.py` (the PostgreSQL statements) and `claim_orm.py`
(the claim off PostgreSQL) import it; it imports none of them.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django_venturi.models import Job
from django_venturi.store.rate_limits import RateRule

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
    fair_key: str | None = None
    """A fair kind's job: the value of its `fair_by` field (the claim's turns go by it)."""
    trace_context: dict[str, str] | None = None
    """The W3C headers of the span that enqueued it (`tracing.py`): its runs' spans link
    to it."""
    run_at: datetime | None = None
    """When it became due (`Job.run_at` as claimed): its wait ran from there to its start."""

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
        with_data: bool = True,
    ) -> ClaimedJob:
        """A claimed job built from a `Job` row and the claim's own values.

        `with_data=False`: without its payload and carry (None), for a run that is
        judged without running (lease recovery), from a row loaded without them.
        """
        return cls(
            id=job.id,
            kind=job.kind,
            queue=job.queue,
            priority=job.priority,
            payload=job.payload if with_data else None,
            carry=job.carry if with_data else None,
            attempt=attempt,
            failures=job.failures,
            enqueued_at=job.enqueued_at,
            started_at=started_at,
            claim_token=claim_token,
            lease=lease,
            claim_sent=time.monotonic() if claim_sent is None else claim_sent,
            has_dependents=job.dependents > 0,
            keyed=job.dedup_key is not None,
            fair_key=job.fair_key,
            trace_context=job.trace_context if with_data else None,
            run_at=job.run_at if with_data else None,
        )


class Claimed(list[ClaimedJob]):
    """The jobs one claim took, in the order to run them.

    `counted_later`: the claim left the capped and rate-limited kinds for later,
    because another claim was counting them (it held the caps lock, see
    `claim.py`); the claimer tries them again shortly. `left_behind`: the claim
    may have passed over due jobs of capped or rate-limited kinds for their limits
    (their places may have kept other kinds' jobs out of a short claim, and a
    finishing run or a passing window gives them room): the claimer claims again
    after such a claim, and after its runs finish. `fair_cursors`: per fair kind,
    the key of its last turn in this claim (`claim_fair.py`). A plain list
    otherwise.
    """

    __slots__ = ("counted_later", "fair_cursors", "left_behind")

    def __init__(
        self,
        jobs: Iterable[ClaimedJob] = (),
        *,
        counted_later: bool = False,
        left_behind: bool = False,
        fair_cursors: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(jobs)
        self.counted_later = counted_later
        self.left_behind = left_behind or counted_later
        self.fair_cursors: Mapping[str, str] = fair_cursors or {}


@dataclasses.dataclass(frozen=True, slots=True)
class KindLimit:
    """How many more jobs of one kind a claim may take."""

    kind: str
    global_cap: int | None
    """The task's `concurrency=`: running jobs of the kind across all workers (of each
    value of `key`, with one)."""
    local_room: int | None
    """What this worker's `--kind-concurrency` still allows."""
    key: str | None = None
    """The payload field a keyed cap counts running jobs by (`Concurrency(n, key=)`)."""


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
    fair_kinds: Sequence[str] = ()
    """Kinds whose jobs take turns by their `fair_by` field (`claim_fair.py`)."""
    start_room: int | None = None
    """How many jobs of rate-limited and per-key capped kinds this claim may take
    (None: no bound).

    The worker passes its idle handler slots: such a job starts as soon as it is
    claimed, never waits in the local buffer, so its start is the one counted and
    it never holds its key's place while it waits."""

    def lease_of(self, kind: str) -> timedelta:
        """The lease a claimed job of `kind` gets."""
        for known, lease in zip(self.kinds, self.leases, strict=True):
            if known == kind:
                return lease
        assert self.prefix_lease is not None, f"{kind!r} is not claimable"
        return self.prefix_lease

    def started_at_once(self) -> list[str]:
        """The kinds whose jobs this claim takes only into idle slots (`start_room`)."""
        kinds = [rule.kind for rule in self.rates]
        return kinds + [limit.kind for limit in self.limits if limit.key is not None]

    def claims_some_kind(self) -> bool:
        return bool(self.kinds) or self.kind_prefix is not None

    @property
    def limited(self) -> bool:
        """Whether a kind it may take is capped or rate-limited (the full claim statement,
        which tells whether it left jobs of such kinds behind: `Claimed.left_behind`)."""
        return bool(self.limits or self.rates)

    @property
    def serialised(self) -> bool:
        """Whether the claim must hold the caps lock: it counts running jobs or starts."""
        return bool(self.serialised_kinds())

    def limited_kinds(self) -> set[str]:
        """The kinds it may take that are capped or rate-limited."""
        return {limit.kind for limit in self.limits} | {rule.kind for rule in self.rates}

    def serialised_kinds(self) -> list[str]:
        """The kinds whose claim must hold the caps lock: globally capped (a kind or each
        of its keys) and rate-limited ones."""
        kinds = {rule.kind for rule in self.rates}
        kinds |= {limit.kind for limit in self.limits if limit.global_cap is not None}
        return sorted(kinds)


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
