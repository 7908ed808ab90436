"""The claim off PostgreSQL (SQLite, MariaDB and MySQL): the selection of
`claim_statement.py`'s statement, made through the ORM in a transaction. On SQLite
that transaction is IMMEDIATE: it holds the database's write lock from its first
statement, so claims serialise and count each other's running jobs and rate-limited
starts. On MariaDB and MySQL claims run at once: the chosen jobs are locked with
`SKIP LOCKED` and taken only if still ready, so two claims never take one job (the
caps and rate limits, counted without that lock, are refused there: `checks.py`).

`claim.py` calls `claim_orm` and `upcoming_orm` when the database is not
PostgreSQL; `claim_types.py` holds the request and the results.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, Exists, F, Min, OuterRef, Q, QuerySet
from django.utils import timezone

from django_venturi.models import Job, RateStart
from django_venturi.states import State
from django_venturi.store.claim_fair import fair_rows_orm, last_turns
from django_venturi.store.claim_types import (
    Claimed,
    ClaimedJob,
    ClaimRequest,
    KindLimit,
    Upcoming,
)
from django_venturi.store.concurrency import field_text, payload_key
from django_venturi.store.pauses import paused_names
from django_venturi.store.rate_limits import RateRule, key_value, next_opening
from django_venturi.store.scheduling import TIERS, TierClock


def claim_orm(alias: str, request: ClaimRequest, clock: TierClock, token: uuid.UUID) -> Claimed:
    """`claim.claim` off PostgreSQL: the jobs it took, in id order (`claim` puts them
    in turn order)."""
    with transaction.atomic(using=alias):
        sent = time.monotonic()  # inside the transaction: after the database's write lock
        now = timezone.now()
        room = _room_orm(alias, request.limits)
        paused_queues, paused_kinds = paused_names(alias)
        starts = _StartRoom(request)
        rates = _RatesOrm(alias, request, now, starts)
        keys = _CapKeysOrm(alias, request, starts)
        kinds = [
            kind
            for kind in request.kinds
            if room.get(kind, 1) > 0
            and kind not in paused_kinds
            and rates.may_take(kind)
            and keys.may_take(kind)
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
        due = keys.without_full_keys(rates.without_full_keys(due))
        turns: dict[int, tuple[str, int, str]] = {}
        candidates = [
            candidate
            for tier in TIERS
            for candidate in _tier_candidates(
                due.filter(priority=tier), tier, clock, request, turns
            )
        ]
        chosen: list[int] = []
        # As the statement's last column: limited kinds or keys out of the scan, or
        # candidates the limits turn away.
        left_behind = bool(
            request.limited_kinds() - set(kinds) - set(paused_kinds)
            or rates.full_keys()
            or keys.full_keys()
        )
        for _, _, job_id, kind, payload in sorted(candidates, key=lambda entry: entry[:3]):
            if len(chosen) == request.limit:
                break
            if room.get(kind, 1) < 1 or not keys.fits(kind, payload):
                left_behind = True
                continue
            if not rates.take(job_id, kind, payload):
                left_behind = True
                continue
            keys.take(kind, payload)
            if kind in room:
                room[kind] -= 1
            chosen.append(job_id)
        rates.record()
        jobs = _lock_still_ready(alias, chosen)
        left_behind = left_behind or len(jobs) < len(chosen)
        chosen = [job.id for job in jobs]
        for kind in {job.kind for job in jobs}:
            Job.objects.using(alias).filter(id__in=chosen, kind=kind).update(
                state=State.RUNNING,
                attempt=F("attempt") + 1,
                claim_token=token,
                claimed_by=request.worker,
                started_at=now,
                lease_expires_at=now + request.lease_of(kind),
            )
    claimed = (
        ClaimedJob.from_row(
            job,
            attempt=job.attempt + 1,
            started_at=now,
            claim_token=token,
            lease=request.lease_of(job.kind),
            claim_sent=sent,
        )
        for job in jobs
    )
    return Claimed(claimed, left_behind=left_behind, fair_cursors=last_turns(chosen, turns))


def _lock_still_ready(alias: str, chosen: list[int]) -> list[Job]:
    """The chosen jobs this claim takes: on SQLite all of them (its write lock already
    serialises claims), on MariaDB and MySQL those no other claim has locked or taken
    since they were read (`SKIP LOCKED`, and a locking read sees the latest commit)."""
    return list(
        Job.objects.using(alias)
        .filter(id__in=chosen, state=State.READY)
        .select_for_update(skip_locked=True)
        .order_by("id")
    )


def _tier_candidates(
    due: QuerySet[Job],
    tier: int,
    clock: TierClock,
    request: ClaimRequest,
    turns: dict[int, tuple[str, int, str]],
) -> list[tuple[float, int, int, str, Any]]:
    """The first `limit` due jobs of each queue in a tier, with their tier turns (taken
    in the order of their queue turns, as the PostgreSQL statement does); a fair
    kind's places go to its keys in turn (`claim_fair.fair_rows_orm`)."""
    queues = due.order_by().values_list("queue", flat=True).distinct()
    in_queue_turns: list[tuple[float, int, datetime, int, str, Any]] = []
    for queue in queues:  # the turns order the candidates, not this loop
        in_queue = due.filter(queue=queue)
        rows = list(
            in_queue.order_by("rank", "run_at", "id").values_list(
                "rank", "run_at", "id", "kind", "payload"
            )[: request.limit]
        )
        if request.fair_kinds:
            rows = fair_rows_orm(in_queue, rows, request.fair_kinds, clock, turns)
        queue_turns = clock.queue_turns(tier, queue, len(rows))
        in_queue_turns.extend((turn, *row) for turn, row in zip(queue_turns, rows, strict=True))
    in_queue_turns.sort(key=lambda entry: entry[:4])
    tier_turns = clock.turns(tier, len(in_queue_turns))
    return [
        (turn, tier, job_id, kind, payload)
        for turn, (_, _, _, job_id, kind, payload) in zip(tier_turns, in_queue_turns, strict=True)
    ]


class _RatesOrm:
    """The rate limits of one claim off PostgreSQL: what each kind and key may still
    start, the starts this claim takes, and their rows (inside the claim's transaction,
    which holds the database's write lock, so claims count each other's starts)."""

    def __init__(
        self, alias: str, request: ClaimRequest, now: datetime, starts: _StartRoom
    ) -> None:
        self.alias = alias
        self.now = now
        self.rules = {rule.kind: rule for rule in request.rates}
        self.starts = starts
        self.used = {rule.kind: _counted_starts(alias, rule, now) for rule in request.rates}
        self.taken: list[RateStart] = []

    def may_take(self, kind: str) -> bool:
        """False for a limited kind this claim cannot start any job of."""
        rule = self.rules.get(kind)
        if rule is None:
            return True
        if self.starts.left < 1:
            return False
        return rule.limit.key is not None or len(self.used[kind].get("", [])) < rule.limit.limit

    def _full(self, kind: str) -> list[str]:
        limit = self.rules[kind].limit.limit
        return [key for key, starts in self.used[kind].items() if len(starts) >= limit]

    def full_keys(self) -> bool:
        """Whether a kind or key is at its limit."""
        return any(self._full(kind) for kind in self.rules)

    def without_full_keys(self, due: QuerySet[Job]) -> QuerySet[Job]:
        """`due` less the jobs whose key is at its limit (so they fill no part of the claim)."""
        for index, (kind, rule) in enumerate(self.rules.items()):
            field = rule.limit.key
            full = self._full(kind)
            if field is None or not full:
                continue
            due = _without_keys(due, kind, field, full, name=f"venturi_rate_key_{index}")
        return due

    def take(self, job_id: int, kind: str, payload: Any) -> bool:
        """Count one start of a job of `kind`; False if its limit has no room."""
        rule = self.rules.get(kind)
        if rule is None:
            return True
        key = key_value(rule.limit, payload)
        starts = self.used[kind].setdefault(key, [])
        if self.starts.left < 1 or len(starts) >= rule.limit.limit:
            return False
        self.starts.left -= 1
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


class _StartRoom:
    """How many more jobs of the kinds started at once (rate-limited, capped per key)
    one claim may take: the worker's idle handler slots."""

    def __init__(self, request: ClaimRequest) -> None:
        self.left = request.limit if request.start_room is None else request.start_room


class _CapKeysOrm:
    """The per-key concurrency caps of one claim off PostgreSQL: the running jobs of
    each key (inside the claim's transaction, which holds the database's write lock,
    so claims count each other's), and the places this claim takes."""

    def __init__(self, alias: str, request: ClaimRequest, starts: _StartRoom) -> None:
        self.limits = {limit.kind: limit for limit in request.limits if limit.key is not None}
        self.starts = starts
        self.rated = {rule.kind for rule in request.rates}
        self.held: dict[str, Counter[str]] = {kind: Counter() for kind in self.limits}
        running = Job.objects.using(alias).filter(state=State.RUNNING, kind__in=list(self.limits))
        for kind, payload in running.values_list("kind", "payload"):
            self.held[kind][field_text(self.limits[kind].key, payload)] += 1

    def may_take(self, kind: str) -> bool:
        """False for a kind capped per key when this claim can start none (no idle slot)."""
        return kind not in self.limits or self.starts.left > 0

    def _full(self, kind: str) -> list[str]:
        cap = self.limits[kind].global_cap
        return [key for key, held in self.held[kind].items() if cap is not None and held >= cap]

    def full_keys(self) -> bool:
        """Whether a key is at its cap."""
        return any(self._full(kind) for kind in self.limits)

    def without_full_keys(self, due: QuerySet[Job]) -> QuerySet[Job]:
        """`due` less the jobs whose key is at its cap (so they fill no part of the claim)."""
        for index, (kind, limit) in enumerate(self.limits.items()):
            full = self._full(kind)
            if full and limit.key is not None:
                due = _without_keys(due, kind, limit.key, full, name=f"venturi_cap_key_{index}")
        return due

    def fits(self, kind: str, payload: Any) -> bool:
        """Whether a job of `kind` with this payload has room under its key's cap."""
        limit = self.limits.get(kind)
        if limit is None:
            return True
        held = self.held[kind][field_text(limit.key, payload)]
        return self.starts.left > 0 and (limit.global_cap is None or held < limit.global_cap)

    def take(self, kind: str, payload: Any) -> None:
        """Count the place a chosen job of `kind` takes (after `fits`)."""
        limit = self.limits.get(kind)
        if limit is not None:
            self.held[kind][field_text(limit.key, payload)] += 1
            if kind not in self.rated:  # a rate-limited kind's start took its room
                self.starts.left -= 1


def _without_keys(
    due: QuerySet[Job], kind: str, field: str, keys: list[str], *, name: str
) -> QuerySet[Job]:
    """`due` less the jobs of `kind` whose payload `field` is one of `keys` (as text)."""
    key = payload_key(due.db, field)
    return due.alias(**{name: key}).exclude(Q(kind=kind) & Q(**{f"{name}__in": keys}))


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
        if limit.local_room is None and limit.key is not None:
            continue  # its keys are counted apart (`_CapKeysOrm`)
        options = [limit.local_room] if limit.local_room is not None else []
        if limit.global_cap is not None and limit.key is None:
            options.append(limit.global_cap - running.get(limit.kind, 0))
        room[limit.kind] = min(options)
    return room


def upcoming_orm(alias: str, request: ClaimRequest) -> Upcoming:
    """`claim.upcoming` off PostgreSQL."""
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
