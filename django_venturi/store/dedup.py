"""Deduplication: at most one live job per task kind and dedup key, and the merge decision.

The database holds the invariant. A partial unique index allows one `ready` job
per (kind, dedup_key); running jobs are not in it, so a job that is claimed
leaves room for exactly one follow-up (`Merge.enqueue()`) behind it.

Producers of one key take turns (`merging.py`): each holds a transaction-level
advisory lock on the key (PostgreSQL; SQLite's IMMEDIATE transactions serialise
everything) while it finds the live job to merge with, locks that row, asks the
task's `merge()` and writes the decision. The lock is held until the caller's
transaction ends, so a rollback undoes the merge and the next producer sees
the job as it was. Workers returning a job to `ready` (pause, retry, release,
lease expiry) take the same lock before they write: see `fold_returning`.

Nothing here imports the models at import time: `Existing` and `Merge` are
public names of the package.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from django_venturi.conf import venturi_settings
from django_venturi.payloads import text
from django_venturi.payloads.codec import PayloadError
from django_venturi.payloads.size import check_size
from django_venturi.registry import TaskSpec, UnknownKind, registry
from django_venturi.states import Priority, State
from django_venturi.store import dependencies
from django_venturi.store.clock import check_representable, database_time
from django_venturi.store.key_locks import KeysBusy, busy_keys, lock_keys

if TYPE_CHECKING:
    from django_venturi.models import Job, JournalEntry
    from django_venturi.store.verdicts import Verdict

logger = logging.getLogger("django_venturi.dedup")

P = TypeVar("P")

MAX_KEY_LENGTH = 200
"""The longest dedup key (the `Job.dedup_key` column)."""


class MergeKind(enum.Enum):
    KEEP = "keep"
    REPLACE = "replace"
    UPDATE = "update"
    ENQUEUE = "enqueue"


@dataclasses.dataclass(frozen=True, slots=True)
class Merge:
    """What `merge(existing)` decided about a new job that clashes with a live one.

    Build one with `Merge.keep()`, `Merge.replace()`, `Merge.update(payload)` or
    `Merge.enqueue()`.
    """

    kind: MergeKind
    payload: Any = None
    """The merged payload (`update` only): an instance of the task class."""
    run_at: datetime | None = None
    """Move the existing job's due time (None: leave it)."""
    priority: Priority | None = None
    """Change the existing job's priority (None: leave it)."""

    @classmethod
    def keep(cls) -> Merge:
        """Drop the new job: the existing one covers it (the default without `merge`)."""
        return cls(MergeKind.KEEP)

    @classmethod
    def replace(cls, *, run_at: datetime | None = None, priority: Priority | None = None) -> Merge:
        """Store the new job's payload in the existing job, replacing its payload."""
        return cls(MergeKind.REPLACE, run_at=run_at, priority=priority)

    @classmethod
    def update(
        cls, payload: Any, *, run_at: datetime | None = None, priority: Priority | None = None
    ) -> Merge:
        """Store `payload` (a merged instance of the task class) in the existing job."""
        return cls(MergeKind.UPDATE, payload=payload, run_at=run_at, priority=priority)

    @classmethod
    def enqueue(cls) -> Merge:
        """Queue the new job as a follow-up behind the existing one; only if that one is running."""
        return cls(MergeKind.ENQUEUE)


class Existing(Generic[P]):
    """The live job a new job clashes with, as `merge(existing)` sees it."""

    __slots__ = (
        "_alias",
        "_journal",
        "attempt",
        "carry",
        "enqueued_at",
        "job_id",
        "merged_count",
        "payload",
        "priority",
        "run_at",
        "state",
    )

    def __init__(
        self,
        *,
        alias: str,
        job_id: int,
        state: State,
        payload: P,
        carry: Any,
        attempt: int,
        run_at: datetime,
        priority: Priority,
        enqueued_at: datetime,
        merged_count: int,
    ) -> None:
        self._alias = alias
        self._journal: list[JournalEntry] | None = None
        self.job_id = job_id
        """The id of the existing job's row."""
        self.state = state
        """`State.READY` or `State.RUNNING`."""
        self.payload = payload
        """Its payload, an instance of the task class."""
        self.carry = carry
        """Its checkpoint (a paused job), or None."""
        self.attempt = attempt
        """Runs started so far."""
        self.run_at = run_at
        """When it is (or was) due."""
        self.priority = priority
        """Its priority tier."""
        self.enqueued_at = enqueued_at
        """When it was first enqueued."""
        self.merged_count = merged_count
        """Enqueues merged into it so far."""

    @property
    def journal(self) -> list[JournalEntry]:
        """Its earlier executions, oldest first (read on first use)."""
        if self._journal is None:
            from django_venturi.models import JournalEntry

            self._journal = list(
                JournalEntry.objects.using(self._alias).filter(job_id=self.job_id).order_by("id")
            )
        return self._journal

    def __repr__(self) -> str:
        return f"<Existing job #{self.job_id} ({self.state}) {self.payload!r}>"


def key_of(spec: TaskSpec, instance: object) -> str | None:
    """Call the task's `dedup_key()` and check what it returned."""
    if not spec.has_dedup:
        return None
    key = instance.dedup_key()  # type: ignore[attr-defined]
    where = f"{spec.cls.__qualname__}.dedup_key()"
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(f"{where} must return a str or None, got {type(key).__name__}")
    if not key:
        raise ValueError(f"{where} returned an empty dedup_key; return None for no deduplication")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"{where} returned a dedup_key of {len(key)} characters ({key[:40]!r}...); "
            f"the limit is {MAX_KEY_LENGTH} (hash long keys)"
        )
    problem = text.problem(key)
    if problem:
        raise PayloadError(where, f"returned a dedup_key that {problem}")
    if not key.isprintable():
        raise ValueError(f"{where} returned a dedup_key with unprintable characters: {key!r}")
    return key


def decide(spec: TaskSpec, instance: object, existing: Existing[Any]) -> Merge:
    """Ask the new job's `merge(existing)`; `keep` when the task has no `merge` method."""
    merge = getattr(instance, "merge", None)
    if not callable(merge):
        return Merge.keep()
    decision = merge(existing)
    where = f"{spec.cls.__qualname__}.merge()"
    if not isinstance(decision, Merge):
        raise TypeError(f"{where} must return a venturi.Merge, got {type(decision).__name__}")
    if decision.kind is MergeKind.ENQUEUE and existing.state != State.RUNNING:
        raise ValueError(
            f"{where} returned Merge.enqueue() but job #{existing.job_id} is {existing.state}: "
            "a follow-up may only be queued behind a running job"
        )
    if decision.run_at is not None and (
        not isinstance(decision.run_at, datetime) or timezone.is_naive(decision.run_at)
    ):
        raise ValueError(f"{where}: run_at must be a timezone-aware datetime")
    if decision.run_at is not None:
        check_representable(decision.run_at, f"{where}: run_at")
    if decision.priority is not None and decision.priority not in Priority.values:
        raise ValueError(f"{where}: priority must be a venturi.Priority")
    return decision


def new_payload(spec: TaskSpec, instance: object, decision: Merge) -> dict[str, Any] | None:
    """The payload a decision stores in the existing job, or None to leave it."""
    if decision.kind is MergeKind.REPLACE:
        return spec.encode(instance)
    if decision.kind is MergeKind.UPDATE:
        payload = spec.encode(decision.payload)
        limit = venturi_settings.MAX_PAYLOAD_BYTES
        check_size(payload, f"{spec.cls.__qualname__}.merge()'s payload", limit)
        return payload
    return None


def decided_changes(payload: dict[str, Any] | None, decision: Merge) -> dict[str, Any]:
    """The fields of the existing job that a merge decision changes."""
    changes: dict[str, Any] = {}
    if payload is not None:
        changes["payload"] = payload
    if decision.run_at is not None:
        changes["run_at"] = decision.run_at
    if decision.priority is not None:
        changes["priority"] = int(decision.priority)
    return changes


def existing_of(alias: str, spec: TaskSpec, job: Job, **overrides: Any) -> Existing[Any]:
    values: dict[str, Any] = {
        "alias": alias,
        "job_id": job.pk,
        "state": State(job.state),
        "payload": spec.decode(job.payload),
        "carry": spec.decode_carry(job.carry),
        "attempt": job.attempt,
        "run_at": job.run_at,
        "priority": Priority(job.priority),
        "enqueued_at": job.enqueued_at,
        "merged_count": job.merged_count,
    }
    values.update(overrides)
    return Existing(**values)


# ---------------------------------------------------------------- workers


@dataclasses.dataclass
class Fold:
    """A job going back to `ready` that absorbs the other ready job(s) of its key."""

    survivor: int
    changes: dict[str, Any]
    absorbed: list[int]


def fold_returning(
    alias: str, verdicts: Sequence[Verdict], *, wait_for_keys: bool = True
) -> tuple[list[Verdict], list[Fold]]:
    """Make room for keyed jobs going back to `ready` (run inside the verdicts' transaction).

    A running job with a ready follow-up of the same key cannot go back to
    `ready` as it is: the unique index allows one ready job per key. The rule:
    the returning job absorbs the follow-up, by the follow-up's `merge()` as if
    it were enqueued now against the returning job (shown as `ready`, due when
    its verdict says). The follow-up is cancelled, its `last_error` naming the
    job that absorbed it. Two jobs of one key returning in the same batch fold
    the same way into the older one. If `merge()` raises or returns
    `enqueue`, the returning job keeps its payload (and a warning is logged
    with the error): a verdict write never fails because of a merge. `merge()`
    runs in a savepoint, so a query of it that the database refuses is undone
    alone; a lost connection still fails the write.

    A job whose cancel was requested does not go back to `ready` (the write
    cancels it), so it absorbs nothing: its follow-up stays ready.

    Never waits for a key's lock while holding job rows: the keys are locked
    first, as producers do. Without `wait_for_keys` it never waits at all: if
    another session holds a key (a producer whose transaction enqueued that key and
    has not ended), it raises `KeysBusy` with the verdicts of that key, so that a
    worker's results writer never stalls behind someone else's open transaction.

    Returns the verdicts to write (absorbed returning jobs become `cancelled`)
    and the changes to apply to survivors after the verdicts are written.
    """
    from django_venturi.models import Job

    # By run: a batch may hold a stale run's verdict beside the live run's of one job.
    returning: dict[tuple[int, uuid.UUID | None], Verdict] = {
        (v.job.id, v.job.claim_token): v for v in verdicts if v.state == State.READY
    }
    if not returning:
        return list(verdicts), []
    keyed = list(
        Job.objects.using(alias)
        .filter(id__in=sorted({job_id for job_id, _ in returning}), dedup_key__isnull=False)
        .values_list("id", "kind", "dedup_key")
    )
    if not keyed:
        return list(verdicts), []
    keys = sorted({(kind, key) for _, kind, key in keyed if key is not None})
    if wait_for_keys:
        lock_keys(alias, keys)
    elif busy := busy_keys(alias, keys):
        waiting = {job_id for job_id, kind, key in keyed if (kind, key) in busy}
        raise KeysBusy([v for (job_id, _), v in returning.items() if job_id in waiting])
    now = database_time(alias)
    # The jobs whose verdict will apply and that really go back to `ready`: still
    # running under the claim token, and not asked to cancel (the write cancels
    # those instead, so they must not absorb anything).
    # Their payloads are read only by a fold that merges (`_fold`), not by every write:
    # deferred here and below.
    locked = {
        job.pk: job
        for job in Job.objects.using(alias)
        .select_for_update()
        .filter(id__in=[job_id for job_id, _, _ in keyed], state=State.RUNNING)
        .defer("payload", "carry", "result", "progress")
        .order_by("id")
        if (job.pk, job.claim_token) in returning and job.cancel_requested_at is None
    }
    # Exactly these (kind, key) pairs: their advisory locks are held, so no producer
    # holds these rows; a row of another pair could be held by a producer waiting
    # for one of our keys.
    of_keys = Q()
    for kind, key in keys:
        of_keys |= Q(kind=kind, dedup_key=key)
    ready = (
        Job.objects.using(alias)
        .select_for_update()
        .filter(of_keys, state=State.READY)
        .defer("payload", "carry", "result", "progress")
        .order_by("id")
    )
    ready_by_key = {(job.kind, job.dedup_key): job for job in ready}
    # Returning runs absorbed by an older job of their key: their verdict cancels them.
    cancelled_runs: set[tuple[int, uuid.UUID | None]] = set()
    folds: list[Fold] = []
    for kind, key in keys:
        group = sorted(
            (job for job in locked.values() if (job.kind, job.dedup_key) == (kind, key)),
            key=lambda job: job.pk,
        )
        twin = ready_by_key.get((kind, key))
        if not group or (twin is None and len(group) == 1):
            continue
        survivor, others = group[0], [*group[1:], *([twin] if twin else [])]
        others.sort(key=lambda job: job.pk)
        fold = _fold(alias, survivor, returning[survivor.pk, survivor.claim_token], others, now)
        folds.append(fold)
        dependencies.move_dependents(alias, fold.absorbed, survivor.pk)
        cancelled_runs.update(
            (job_id, locked[job_id].claim_token) for job_id in fold.absorbed if job_id in locked
        )
        ready_ids = [job_id for job_id in fold.absorbed if job_id not in locked]
        if ready_ids:
            Job.objects.using(alias).filter(id__in=ready_ids).update(
                state=State.CANCELLED,
                finished_at=now,
                last_error=f"merged into job #{survivor.pk} when it went back to ready",
            )
    written = [
        dataclasses.replace(v, state=State.CANCELLED)
        if (v.job.id, v.job.claim_token) in cancelled_runs
        else v
        for v in verdicts
    ]
    return written, folds


def _fold(alias: str, survivor: Job, verdict: Verdict, others: list[Job], now: datetime) -> Fold:
    changes: dict[str, Any] = {}
    absorbed: list[int] = []
    merged = survivor.merged_count
    try:
        spec = registry.get(survivor.kind)
    except UnknownKind:
        spec = None
    for other in others:
        absorbed.append(other.pk)
        merged += other.merged_count + 1
        if spec is None:
            continue
        try:
            view = existing_of(
                alias,
                spec,
                survivor,
                state=State.READY,
                run_at=changes.get("run_at", now + verdict.delay),
                payload=spec.decode(changes.get("payload", survivor.payload)),
                priority=Priority(changes.get("priority", survivor.priority)),
                merged_count=merged - other.merged_count - 1,
            )
            instance = spec.decode(other.payload)
            # A savepoint: a query of merge() that the database refuses is undone
            # alone and leaves the verdicts' transaction usable. A lost connection
            # fails the rollback too, and that error propagates.
            with transaction.atomic(using=alias):
                decision = decide(spec, instance, view)
            if decision.kind is MergeKind.ENQUEUE:
                raise ValueError("Merge.enqueue() is not possible: both jobs would be ready")
            payload = new_payload(spec, instance, decision)
        except Exception as error:  # a user's merge() must never stop a verdict write
            logger.warning(
                "job %d absorbed job %d of the same dedup key without merging: %s: %s",
                survivor.pk,
                other.pk,
                type(error).__name__,
                error,
                exc_info=error,
                extra={"job_id": survivor.pk, "kind": survivor.kind, "absorbed": other.pk},
            )
            continue
        changes.update(decided_changes(payload, decision))
    changes["merged_count"] = merged
    changes["last_merged_at"] = now
    return Fold(survivor=survivor.pk, changes=changes, absorbed=absorbed)


def finish_folds(alias: str, folds: Sequence[Fold]) -> None:
    """Apply the survivors' merged fields and name the survivor in absorbed returning jobs."""
    from django_venturi.models import Job

    for fold in folds:
        Job.objects.using(alias).filter(pk=fold.survivor, state=State.READY).update(**fold.changes)
        Job.objects.using(alias).filter(pk__in=fold.absorbed, state=State.CANCELLED).update(
            last_error=f"merged into job #{fold.survivor} when it went back to ready"
        )
