"""What a write whose answer never came did: the worker asks before it writes again.

A connection can break after the server committed a write and before its answer
reached the worker (a failover, a proxy or a network cut at the wrong moment). The
worker cannot tell such a write from one that never arrived, and writing a verdict
again would be refused by the claim token's fence and journalled as `discarded`
beside the entry the first write made: a completed job whose history says it was
also thrown away, and whose `job_finished` says `discarded`.

So after a write failed on the connection, the results writer looks first: the
journal entry a run's verdict wrote is the proof that it was applied, and says as
what (`applied_outcomes`). A claim whose answer was lost is handed back by its
token (`leases.release_unanswered`).
"""

from __future__ import annotations

from collections.abc import Collection

from django.db.models import Q

from django_venturi.models import JournalEntry
from django_venturi.states import JournalOutcome

AppliedRun = tuple[int, int]
"""A run: its job's id and its attempt (each claim adds one)."""

NOT_A_VERDICT = (JournalOutcome.DISCARDED, JournalOutcome.LEASE_EXPIRED)
"""Journal outcomes a run's own applied verdict never has: a refused write, and the
recovery of a run whose worker went silent (written by whoever recovered it)."""


def applied_outcomes(alias: str, runs: Collection[AppliedRun]) -> dict[AppliedRun, str]:
    """The runs among `runs` whose verdict was applied, and the outcome it was journalled
    with (which may differ from the verdict's: a requeue that a cancel turned into
    `cancelled`). One indexed query by job id."""
    if not runs:
        return {}
    wanted = set(runs)
    rows = (
        JournalEntry.objects.using(alias)
        .filter(job_id__in={job_id for job_id, _ in wanted})
        .filter(~Q(outcome__in=NOT_A_VERDICT))
        .values_list("job_id", "attempt", "outcome")
    )
    return {
        (job_id, attempt): outcome
        for job_id, attempt, outcome in rows
        if (job_id, attempt) in wanted
    }
