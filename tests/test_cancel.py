"""Cancelling a running job: the worker hears of it, the handler stops, the job ends cancelled."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.store import verdicts
from django_venturi.store.claim import ClaimedJob
from django_venturi.store.completion import write_verdicts
from tests.conftest import Workers, wait_until
from tests.testapp import tasks
from tests.testapp.control_tasks import Cancellable
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def journal(alias: str, job: Job) -> list[str]:
    return list(job.journal.using(alias).order_by("id").values_list("outcome", flat=True))


def record_of(alias: str, job: Job, kind: str) -> Record | None:
    return Record.objects.using(alias).filter(job_id=job.id, kind=kind).first()


def test_cancel_reaches_a_running_job(alias: str, workers: Workers) -> None:
    job = Cancellable().enqueue(using=alias)
    workers.start(alias, "--concurrency", "2")
    wait_until(lambda: record_of(alias, job, "cancellable_started"), message="the job to start")

    result = venturi.cancel(job.id, using=alias)
    assert result == venturi.CancelResult(cancelled=0, stopping=1)

    stopped = wait_until(lambda: record_of(alias, job, "cancellable_stopped"), timeout=30)
    assert stopped.value["cancel"] is True
    wait_until(lambda: Job.objects.using(alias).get(id=job.id).state == venturi.State.CANCELLED)
    job.refresh_from_db()
    assert job.finished_at is not None and job.cancel_requested_at is not None
    # The handler returned `completed`; the cancel wins all the same.
    assert journal(alias, job) == ["cancelled"]
    # How the worker learnt of it, not how fast: the speed is benchmarks' business.
    if alias == "default":
        # PostgreSQL: the NOTIFY reaches the worker at once (typically a few ms).
        assert "learnt by notification" in workers.log()
    else:
        # SQLite: at the worker's next heartbeat (a third of the shortest test lease, 0.67 s).
        assert "learnt by heartbeat" in workers.log()


def test_cancelling_a_job_that_finished_meanwhile_changes_nothing(
    alias: str, workers: Workers
) -> None:
    job = tasks.Noop().enqueue(using=alias)
    workers.burst(alias)
    assert venturi.cancel(job.id, using=alias) == venturi.CancelResult(
        cancelled=0, stopping=0, already_finished=1
    )
    job.refresh_from_db()
    assert job.state == venturi.State.COMPLETED and job.cancel_requested_at is None
    assert journal(alias, job) == ["completed"]


def test_a_requeue_of_a_job_asked_to_cancel_cancels_it(alias: str) -> None:
    """Even when the worker never heard of the cancel, the job does not go back to ready."""
    job = tasks.Noop().enqueue(using=alias)
    token = uuid.uuid4()
    Job.objects.using(alias).filter(id=job.id).update(
        state=venturi.State.RUNNING,
        attempt=1,
        claim_token=token,
        lease_expires_at=job.enqueued_at + timedelta(minutes=5),
        started_at=job.enqueued_at,
    )
    job.refresh_from_db()
    claimed = ClaimedJob.from_row(
        job, attempt=1, started_at=job.enqueued_at, claim_token=token, lease=timedelta(minutes=5)
    )
    assert venturi.cancel(job.id, using=alias).stopping == 1
    paused = verdicts.Verdict(claimed, venturi.JournalOutcome.PAUSED, venturi.State.READY)
    assert write_verdicts(alias, "test", [paused]) == {job.id}
    job.refresh_from_db()
    assert job.state == venturi.State.CANCELLED and job.finished_at is not None
    assert journal(alias, job) == ["cancelled"]


def test_cancel_says_what_it_did_with_each_job(alias: str) -> None:
    """Cancelled, stopping, already finished, unknown: each distinct id counted once."""
    ready, running, waiting, completed, failed, cancelled = venturi.enqueue_many(
        [tasks.Noop(n=i) for i in range(6)], using=alias
    )
    jobs = Job.objects.using(alias)
    jobs.filter(pk=running.pk).update(
        state=venturi.State.RUNNING,
        attempt=1,
        claim_token=uuid.uuid4(),
        lease_expires_at=running.enqueued_at + timedelta(minutes=5),
    )
    jobs.filter(pk=waiting.pk).update(state=venturi.State.WAITING, waiting_for=1)
    for job, finished in [
        (completed, venturi.State.COMPLETED),
        (failed, venturi.State.FAILED),
        (cancelled, venturi.State.CANCELLED),
    ]:
        jobs.filter(pk=job.pk).update(state=finished, finished_at=job.enqueued_at)
    gone = cancelled.pk + 1000
    asked = [ready, running.pk, waiting, completed.pk, failed, cancelled.pk, gone, gone, ready.pk]

    result = venturi.cancel(asked, using=alias)

    assert result == venturi.CancelResult(cancelled=2, stopping=1, already_finished=3, unknown=1)
    states = dict(jobs.values_list("id", "state"))
    assert states[ready.pk] == states[waiting.pk] == venturi.State.CANCELLED
    assert states[running.pk] == venturi.State.RUNNING
    assert (states[completed.pk], states[failed.pk]) == ("completed", "failed")
    # Again: the two it cancelled have finished; the running one is still stopping.
    again = venturi.cancel([ready, waiting, running], using=alias)
    assert again == venturi.CancelResult(cancelled=0, stopping=1, already_finished=2)
    assert venturi.cancel([], using=alias) == venturi.CancelResult(0, 0, 0, 0)


def test_cancel_result_keeps_its_two_field_constructor() -> None:
    result = venturi.CancelResult(cancelled=2, stopping=1)
    assert (result.already_finished, result.unknown) == (0, 0)
    assert result == venturi.CancelResult(2, 1, 0, 0)


@pytest.mark.parametrize("bad", ["12", b"12", [1.5], [True], [None]])
def test_cancel_refuses_what_is_not_a_job_or_an_id(bad: object) -> None:
    with pytest.raises(TypeError, match=r"cancel\(jobs=\.\.\.\): expected a Job"):
        venturi.cancel(bad)  # type: ignore[arg-type]


def test_cancel_refuses_an_unsaved_job() -> None:
    with pytest.raises(ValueError, match=r"cancel\(jobs=\.\.\.\): .* has no id"):
        venturi.cancel(Job(kind="tests.noop"))
