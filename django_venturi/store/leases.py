"""Leases: extending the ones a worker holds, and recovering the ones that ran out.

A claim lives until `lease_expires_at`. A live worker extends all the leases it
holds in one statement every heartbeat interval, skipping rows that another
session holds locked (never waiting on them). A worker that vanished stops
extending and stops beating; once its leases run out any live worker recovers
the jobs: the lost run is journalled as `lease_expired`, counts as a failed
attempt, and the job goes back to `ready` with backoff (or `failed` if it gives
up).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from datetime import timedelta

from django.db import connections, transaction
from django.db.models import Exists, F, OuterRef, QuerySet

from django_venturi.conf import MAX_BATCH_SIZE
from django_venturi.models import Job, WorkerProcess
from django_venturi.registry import UnknownKind, registry
from django_venturi.states import JournalOutcome, State
from django_venturi.store import key_locks, statements, verdicts
from django_venturi.store.claim import ClaimedJob, RunKey
from django_venturi.store.clock import now_expression
from django_venturi.store.completion import write_verdicts
from django_venturi.store.row_locks import own_rows
from django_venturi.store.verdicts import ErrorInfo

RECOVERY_BATCH_SIZE = 100
RECOVERY_FIELDS = (
    "id",
    "kind",
    "queue",
    "priority",
    "state",
    "dedup_key",
    "attempt",
    "failures",
    "enqueued_at",
    "started_at",
    "claim_token",
    "claimed_by",
    "lease_expires_at",
    "dependents",
)
"""What lease recovery loads of an expired job: what its lost run's verdict needs."""


@dataclasses.dataclass(frozen=True, slots=True)
class Extension:
    """What one heartbeat found about the runs it was given."""

    extended: set[RunKey]
    """Runs whose lease now runs from now."""
    busy: set[RunKey]
    """Runs still held, whose row another session had locked: extended next time."""

    def held(self, key: RunKey) -> bool:
        return key in self.extended or key in self.busy


_EXTEND_SQL = """
WITH mine(id, token, seconds) AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(seconds)s::float8[])
),
-- Rows another session holds locked (a producer merging into the job, this
-- worker's own verdict write) are skipped, not waited for: a heartbeat never
-- queues behind anyone's transaction. They stay held and are extended next time.
free AS (
    SELECT job.id FROM {table} AS job JOIN mine ON mine.id = job.id AND mine.token = job.claim_token
    WHERE job.id = ANY(%(ids)s::bigint[]) AND job.state = 'running'
    FOR NO KEY UPDATE OF job SKIP LOCKED
),
extended AS (
    UPDATE {table} AS job SET lease_expires_at = now() + make_interval(secs => mine.seconds)
    FROM mine
    WHERE job.id IN (SELECT id FROM free) AND mine.id = job.id
    RETURNING job.id
)
-- Still held: running under the run's token (as of this statement's start).
SELECT mine.id, mine.token, extended.id IS NOT NULL
FROM mine
JOIN {table} AS job ON job.id = mine.id AND job.claim_token = mine.token AND job.state = 'running'
LEFT JOIN extended ON extended.id = mine.id
"""


def extend(alias: str, jobs: Iterable[ClaimedJob]) -> Extension:
    """Extend the leases of the runs of `jobs`, never waiting on another session's lock."""
    runs = {(job.id, job.claim_token): job for job in jobs}
    if not runs:
        return Extension(set(), set())
    if connections[alias].vendor == "postgresql":
        return _extend_postgresql(alias, list(runs.values()))
    return _extend_orm(alias, list(runs.values()))


def _extend_postgresql(alias: str, jobs: list[ClaimedJob]) -> Extension:
    table = connections[alias].ops.quote_name(Job._meta.db_table)
    params = {
        "ids": [job.id for job in jobs],
        "tokens": [job.claim_token for job in jobs],
        "seconds": [job.lease.total_seconds() for job in jobs],
    }
    rows = statements.fetch(alias, _EXTEND_SQL.format(table=table), params)
    extension = Extension(set(), set())
    for job_id, token, extended in rows:
        (extension.extended if extended else extension.busy).add((job_id, token))
    return extension


def _extend_orm(alias: str, jobs: list[ClaimedJob]) -> Extension:
    """SQLite: one writer at a time, no row locks to skip."""
    groups: dict[tuple[uuid.UUID, timedelta], list[int]] = defaultdict(list)
    for job in jobs:
        groups[(job.claim_token, job.lease)].append(job.id)
    extended: set[RunKey] = set()
    for (token, lease), ids in groups.items():
        fenced = Job.objects.using(alias).filter(id__in=ids, claim_token=token, state=State.RUNNING)
        updated = fenced.update(lease_expires_at=now_expression(alias) + lease)
        held = ids if updated == len(ids) else fenced.values_list("id", flat=True)
        extended.update((job_id, token) for job_id in held)
    return Extension(extended, set())


def cancel_requests(alias: str, jobs: Iterable[ClaimedJob]) -> set[RunKey]:
    """The runs among `jobs`, still holding their claim, that `venturi.cancel()` asked to stop."""
    runs = {job.run_key for job in jobs}
    if not runs:
        return set()
    rows = (
        Job.objects.using(alias)
        .filter(
            id__in=sorted({job_id for job_id, _ in runs}),
            state=State.RUNNING,
            cancel_requested_at__isnull=False,
        )
        .values_list("id", "claim_token")
    )
    return {
        (job_id, token) for job_id, token in rows if token is not None and (job_id, token) in runs
    }


def recover_expired(alias: str, worker: str) -> list[int]:
    """Recover jobs whose lease ran out while their worker was silent; return their ids.

    The expired rows are locked with SKIP LOCKED and each write is fenced by the
    token read under that lock, so however many workers recover at once, each
    expired claim is recovered exactly once.

    A lease that ran out while its worker kept beating is not lost: that worker
    could not extend it because another session held the row locked (a producer
    merging into the job), and extends it as soon as the lock is gone. Only a
    worker that went silent (stopped, killed, paused, cut off from the database)
    loses its jobs to others; a live worker's own orphans (a claim whose answer
    the connection lost) are recovered by that worker (`recover_orphans`).
    """
    return _recover(alias, worker, _expired(alias).exclude(Exists(_beat_before_expiry())))


def recover_orphans(alias: str, worker: str, held: Iterable[RunKey]) -> list[int]:
    """Recover the expired jobs claimed by `worker` that it does not hold (a claim whose
    answer never reached it, a verdict the database refused even as a failed run);
    return their ids."""
    keep = set(held)
    mine = _expired(alias).filter(claimed_by=worker)
    return _recover(alias, worker, mine, skip=lambda job: (job.pk, job.claim_token) in keep)


def release_unanswered(alias: str, worker: str, tokens: Collection[uuid.UUID]) -> list[int]:
    """Hand back the jobs of this worker's claims whose answer never reached it (the
    connection broke after the server ran the claim): ready again at once, journalled
    `released`, not a failure. Return their ids. Without this they would wait for
    their lease to run out (`recover_orphans`)."""
    unanswered = Job.objects.using(alias).filter(
        state=State.RUNNING, claimed_by=worker, claim_token__in=list(tokens)
    )
    released: list[int] = []
    for _ in range(MAX_BATCH_SIZE // RECOVERY_BATCH_SIZE + 1):  # a claim's jobs at most
        batch = _recover(alias, worker, unanswered, lost_run=_unanswered_run)
        if not batch:
            break
        released.extend(batch)
    return released


def _expired(alias: str) -> QuerySet[Job]:
    return Job.objects.using(alias).filter(
        state=State.RUNNING, lease_expires_at__lt=now_expression(alias)
    )


def _beat_before_expiry() -> QuerySet[WorkerProcess]:
    """The job's worker, alive: it beat within its grace (two heartbeat intervals) before
    the job's lease ran out, or later.

    A live worker beats every interval, so whenever a lease of its runs out it has
    beaten within the grace; a dead one beat last just after it last extended the
    lease, at least three intervals (the shortest lease it knows) before it ran out.
    """
    return WorkerProcess.objects.filter(
        name=OuterRef("claimed_by"),
        stopped_at__isnull=True,
        heartbeat_at__gt=OuterRef("lease_expires_at") - F("heartbeat_grace"),
    )


def _recover(
    alias: str,
    worker: str,
    expired: QuerySet[Job],
    skip: Callable[[Job], bool] = lambda job: False,
    lost_run: Callable[[Job], verdicts.Verdict] | None = None,
) -> list[int]:
    # Only the fields a lost run's verdict needs: never the payload, carry or result,
    # which recovery has no use for (and which may be a value Python cannot read).
    expired = expired.only(*RECOVERY_FIELDS)
    with transaction.atomic(using=alias):
        rows = [
            job
            for job in expired.select_for_update(skip_locked=True, of=own_rows(alias)).order_by(
                "lease_expires_at"
            )[:RECOVERY_BATCH_SIZE]
            if not skip(job)
        ]
        # Keys after rows, so without waiting: a keyed job whose key a producer holds
        # is left for the next round (waiting could deadlock with that producer).
        lost = [(lost_run or _lost_run)(job) for job in key_locks.with_keys_locked_now(alias, rows)]
        write_verdicts(alias, worker, lost)
    return [verdict.job.id for verdict in lost]


def _unanswered_run(job: Job) -> verdicts.Verdict:
    """The verdict of a run its worker never heard of: handed back, not a failure."""
    return verdicts.released(_claimed(job))


def _claimed(job: Job) -> ClaimedJob:
    """A claimed job as recovery sees it: without payload, carry or result."""
    return ClaimedJob.from_row(
        job,
        attempt=job.attempt,
        started_at=job.started_at or job.enqueued_at,
        claim_token=job.claim_token or uuid.UUID(int=0),
        lease=timedelta(0),
        with_data=False,
    )


def _lost_run(job: Job) -> verdicts.Verdict:
    try:
        spec = registry.get(job.kind)
    except UnknownKind:
        spec = None  # recover it all the same, with the default give-up policy
    claimed = _claimed(job)
    error = ErrorInfo.from_reason(
        f"the lease of worker {job.claimed_by or '?'} expired at {job.lease_expires_at}; "
        "the worker stopped or lost the database",
        type="django_venturi.LeaseExpired",
    )
    verdict = verdicts.retry(claimed, spec, error, outcome=JournalOutcome.LEASE_EXPIRED)
    return dataclasses.replace(verdict, worker=job.claimed_by)
