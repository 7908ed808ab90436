"""Writing verdicts: fenced by claim token, and well defined when a batch names one run twice."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections, transaction

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.store import retention, verdicts
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.completion import write_verdicts
from django_venturi.store.scheduling import TierClock
from tests.testapp.dedup_tasks import Recompute
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def claim_one(alias: str, kind: str) -> ClaimedJob:
    request = ClaimRequest(
        worker="test", limit=1, kinds=[kind], leases=[timedelta(minutes=5)], queues=None
    )
    (job,) = claim(alias, request, TierClock((6, 3, 1)))
    return job


def outcomes(alias: str, job_id: int) -> list[str]:
    return list(
        Job.objects.using(alias)
        .get(pk=job_id)
        .journal.order_by("id")
        .values_list("outcome", flat=True)
    )


@pytest.mark.parametrize(
    ("first", "second", "state"),
    [
        ("released", "completed", venturi.State.READY),
        ("completed", "released", venturi.State.COMPLETED),
        ("failed", "completed", venturi.State.FAILED),
        ("completed", "cancelled", venturi.State.COMPLETED),
    ],
)
def test_the_first_verdict_of_a_run_wins_and_later_ones_are_discarded(
    alias: str, first: str, second: str, state: venturi.State
) -> None:
    make = {
        "released": verdicts.released,
        "completed": verdicts.completed,
        "cancelled": verdicts.cancelled,
        "failed": lambda job: verdicts.failed(job, verdicts.ErrorInfo("E", "no")),
    }
    for _ in range(5):  # PostgreSQL used to apply whichever its join met first
        Noop().enqueue(using=alias)
        run = claim_one(alias, "tests.noop")
        applied = write_verdicts(alias, "test", [make[first](run), make[second](run)])
        assert applied == {run.id}
        job = Job.objects.using(alias).get(pk=run.id)
        assert job.state == state and job.claim_token is None
        assert job.failures == (1 if first == "failed" else 0)
        assert outcomes(alias, run.id) == [first, "discarded"]
        Job.objects.using(alias).all().delete()


def test_a_discarded_second_verdict_does_not_fold_the_follow_up(alias: str) -> None:
    Recompute(account="d", count=1).enqueue(using=alias)
    run = claim_one(alias, "tests.recompute")
    follow_up = Recompute(account="d", count=2).enqueue(using=alias)
    applied = write_verdicts(alias, "test", [verdicts.completed(run), verdicts.released(run)])
    assert applied == {run.id}
    assert Job.objects.using(alias).get(pk=run.id).state == venturi.State.COMPLETED
    kept = Job.objects.using(alias).get(pk=follow_up.pk)
    assert kept.state == venturi.State.READY and kept.payload["count"] == 2
    assert outcomes(alias, run.id) == ["completed", "discarded"]


def test_verdicts_of_other_runs_in_the_batch_are_unaffected(alias: str) -> None:
    first, second = Noop(n=1).enqueue(using=alias), Noop(n=2).enqueue(using=alias)
    run_1, run_2 = claim_one(alias, "tests.noop"), claim_one(alias, "tests.noop")
    assert {run_1.id, run_2.id} == {first.pk, second.pk}
    batch = [verdicts.completed(run_1), verdicts.released(run_2), verdicts.released(run_1)]
    assert write_verdicts(alias, "test", batch) == {run_1.id, run_2.id}
    assert Job.objects.using(alias).get(pk=run_1.id).state == venturi.State.COMPLETED
    assert Job.objects.using(alias).get(pk=run_2.id).state == venturi.State.READY
    assert outcomes(alias, run_1.id) == ["completed", "discarded"]
    assert outcomes(alias, run_2.id) == ["released"]


def test_a_stale_runs_verdict_beside_the_live_runs_is_discarded(alias: str) -> None:
    """PostgreSQL joined the journal to the applied row by job id: both were journalled."""
    Noop().enqueue(using=alias)
    stale = claim_one(alias, "tests.noop")
    write_verdicts(alias, "test", [verdicts.released(stale)])
    live = claim_one(alias, "tests.noop")
    batch = [verdicts.completed(live), verdicts.completed(stale)]
    assert write_verdicts(alias, "test", batch) == {live.id}
    assert outcomes(alias, live.id) == ["released", "completed", "discarded"]
    batch = [verdicts.completed(stale), verdicts.completed(live)]
    assert write_verdicts(alias, "test", batch) == set()
    assert outcomes(alias, live.id)[3:] == ["discarded", "discarded"]


def test_the_journal_keeps_the_batch_order(alias: str) -> None:
    Noop().enqueue(using=alias)
    stale = claim_one(alias, "tests.noop")
    write_verdicts(alias, "test", [verdicts.released(stale)])
    live = claim_one(alias, "tests.noop")
    batch = [verdicts.completed(live), verdicts.released(live), verdicts.completed(stale)]
    assert write_verdicts(alias, "test", batch) == {live.id}
    entries = Job.objects.using(alias).get(pk=live.id).journal.order_by("id")
    assert list(entries.values_list("attempt", "outcome")) == [
        (1, "released"),
        (2, "completed"),
        (2, "discarded"),
        (1, "discarded"),
    ]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_job_deleted_while_its_verdict_is_written_leaves_no_journal_entry() -> None:
    """The journal's link to its job is not a database constraint: deleting a job waits
    for a verdict that holds it, so the entry that verdict adds goes with the job."""
    Noop().enqueue(using="default")
    run = claim_one("default", "tests.noop")
    written, finish = threading.Event(), threading.Event()

    def write_and_hold() -> None:
        try:
            with transaction.atomic(using="default"):
                write_verdicts("default", "test", [verdicts.completed(run)])
                written.set()
                finish.wait(10)
        finally:
            connections.close_all()

    def delete() -> None:
        try:
            retention.delete_jobs(Job.objects.filter(pk=run.id), using="default")
        finally:
            connections.close_all()

    writer = threading.Thread(target=write_and_hold)
    writer.start()
    assert written.wait(10)
    deleter = threading.Thread(target=delete)
    deleter.start()
    deleter.join(0.5)
    assert deleter.is_alive(), "the delete did not wait for the verdict holding the job"
    finish.set()
    writer.join(10)
    deleter.join(10)
    assert not Job.objects.filter(pk=run.id).exists()
    assert not JournalEntry.objects.filter(job_id=run.id).exists()
