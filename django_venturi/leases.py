"""Leases: extending the ones a worker holds, and recovering the ones that ran out.

A claim lives until `lease_expires_at`. A live worker extends all the leases it
holds, one statement per claim batch, every heartbeat interval. A worker that
vanished stops extending; once its leases run out any live worker recovers the
jobs: the lost run is journalled as `lease_expired`, counts as a failed attempt,
and the job goes back to `ready` with backoff (or `failed` if it gives up).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta

from django.db import transaction

from django_venturi import dedup, verdicts
from django_venturi.claim import ClaimedJob
from django_venturi.clock import now_expression
from django_venturi.completion import write_verdicts
from django_venturi.models import Job
from django_venturi.registry import UnknownKind, registry
from django_venturi.states import JournalOutcome, State
from django_venturi.verdicts import ErrorInfo

RECOVERY_BATCH_SIZE = 100


def extend(alias: str, jobs: Iterable[ClaimedJob]) -> set[int]:
    """Extend the leases of `jobs`; return the ids whose lease this worker still holds."""
    groups: dict[tuple[uuid.UUID, timedelta], list[int]] = defaultdict(list)
    for job in jobs:
        groups[(job.claim_token, job.lease)].append(job.id)
    held: set[int] = set()
    for (token, lease), ids in groups.items():
        fenced = Job.objects.using(alias).filter(id__in=ids, claim_token=token, state=State.RUNNING)
        updated = fenced.update(lease_expires_at=now_expression(alias) + lease)
        if updated == len(ids):
            held.update(ids)
        else:
            held.update(fenced.values_list("id", flat=True))
    return held


def cancel_requests(alias: str, jobs: Iterable[ClaimedJob]) -> set[int]:
    """The ids among `jobs`, still held by their claim, that `venturi.cancel()` asked to stop."""
    tokens = {job.id: job.claim_token for job in jobs}
    if not tokens:
        return set()
    rows = (
        Job.objects.using(alias)
        .filter(id__in=list(tokens), state=State.RUNNING, cancel_requested_at__isnull=False)
        .values_list("id", "claim_token")
    )
    return {job_id for job_id, token in rows if tokens.get(job_id) == token}


def recover_expired(alias: str, worker: str) -> list[int]:
    """Recover jobs whose lease ran out; return their ids.

    The expired rows are locked with SKIP LOCKED and each write is fenced by the
    token read under that lock, so however many workers recover at once, each
    expired claim is recovered exactly once.
    """
    with transaction.atomic(using=alias):
        expired = list(
            Job.objects.using(alias)
            .select_for_update(skip_locked=True)
            .filter(state=State.RUNNING, lease_expires_at__lt=now_expression(alias))
            .order_by("lease_expires_at")[:RECOVERY_BATCH_SIZE]
        )
        # Keys after rows, so without waiting: a keyed job whose key a producer holds
        # is left for the next round (waiting could deadlock with that producer).
        expired = dedup.with_keys_locked_now(alias, expired)
        lost = [_lost_run(job) for job in expired]
        write_verdicts(alias, worker, lost)
    return [verdict.job.id for verdict in lost]


def _lost_run(job: Job) -> verdicts.Verdict:
    try:
        spec = registry.get(job.kind)
    except UnknownKind:
        spec = None  # recover it all the same, with the default give-up policy
    claimed = ClaimedJob.from_row(
        job,
        attempt=job.attempt,
        started_at=job.started_at or job.enqueued_at,
        claim_token=job.claim_token or uuid.UUID(int=0),
        lease=timedelta(0),
    )
    error = ErrorInfo.from_reason(
        f"the lease of worker {job.claimed_by or '?'} expired at {job.lease_expires_at}; "
        "the worker stopped or lost the database",
        type="django_venturi.LeaseExpired",
    )
    verdict = verdicts.retry(claimed, spec, error, outcome=JournalOutcome.LEASE_EXPIRED)
    return dataclasses.replace(verdict, worker=job.claimed_by)
