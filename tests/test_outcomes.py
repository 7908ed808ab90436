"""The four outcomes, applied by a real `venturi_worker --burst` subprocess."""

from __future__ import annotations

import pytest

import django_venturi as venturi
from django_venturi.models import Job
from tests.conftest import Workers, wait_until
from tests.test_codec import full_payload
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def journal(alias: str, job: Job) -> list[str]:
    return list(job.journal.using(alias).order_by("id").values_list("outcome", flat=True))


def test_completed_jobs_and_every_payload_type(alias: str, workers: Workers) -> None:
    noop = tasks.Noop(n=3).enqueue(using=alias)
    typed = tasks.AllTypes(**full_payload().__dict__).enqueue(using=alias)
    workers.burst(alias)
    for job in (noop, typed):
        job.refresh_from_db()
        assert job.state == venturi.State.COMPLETED
        assert job.finished_at is not None and job.attempt == 1
        assert journal(alias, job) == ["completed"]
    received = Record.objects.using(alias).get(kind="all_types").value
    assert received == {"repr": repr(full_payload()), "types_ok": True}


def test_pause_resumes_with_the_carry_and_does_not_count_as_failure(
    alias: str, workers: Workers
) -> None:
    job = tasks.Pausing(steps=4).enqueue(using=alias)
    workers.burst(alias)
    job.refresh_from_db()
    assert job.state == venturi.State.COMPLETED
    assert journal(alias, job) == ["paused", "paused", "paused", "completed"]
    seen = list(Record.objects.using(alias).order_by("id").values_list("value", flat=True))
    assert seen == [0, 1, 2, 3]
    assert job.attempt == 4 and job.failures == 0
    assert job.carry == {"done": 3}


def test_a_raised_error_is_retried_until_the_job_completes_and_journals_each_error(
    alias: str, workers: Workers
) -> None:
    flaky = tasks.Flaky(failures=2).enqueue(using=alias)
    workers.burst(alias)
    flaky.refresh_from_db()
    assert flaky.state == venturi.State.COMPLETED
    assert journal(alias, flaky) == ["retry", "retry", "completed"]
    assert flaky.failures == 2
    first = flaky.journal.using(alias).order_by("id").first()
    assert first is not None
    assert first.error_type == "builtins.RuntimeError"
    assert first.error_message == "flaky failure 1"
    assert "Traceback" in first.traceback and "raise RuntimeError" in first.traceback


def test_a_retry_outcome_runs_the_job_again_until_it_completes(
    alias: str, workers: Workers
) -> None:
    asks = tasks.AsksRetry().enqueue(using=alias)
    workers.burst(alias)
    asks.refresh_from_db()
    assert asks.state == venturi.State.COMPLETED
    assert journal(alias, asks) == ["retry", "completed"]


def test_permanent_failures_are_not_retried(alias: str, workers: Workers) -> None:
    raised = tasks.Permanent().enqueue(using=alias)
    returned = tasks.Permanent(use_outcome=True).enqueue(using=alias)
    workers.burst(alias)
    for job, message in [(raised, "the address does not exist"), (returned, "the outcome says no")]:
        job.refresh_from_db()
        assert job.state == venturi.State.FAILED and job.attempt == 1
        assert journal(alias, job) == ["failed"]
        assert message in job.last_error


def test_give_up_after_max_attempts(alias: str, workers: Workers) -> None:
    job = tasks.AlwaysFails().enqueue(using=alias)
    workers.burst(alias)
    job.refresh_from_db()
    assert job.state == venturi.State.FAILED
    assert journal(alias, job) == ["retry", "retry", "failed"]
    last = job.journal.using(alias).order_by("id").last()
    assert last is not None and "gave up after 3 failed attempts" in last.error_message


def test_give_up_after_a_duration(alias: str, workers: Workers) -> None:
    # A running worker first, so that start-up time does not eat the 1 s window.
    probe = tasks.Noop(n=0).enqueue(using=alias)
    workers.start(alias)
    wait_until(lambda: Record.objects.using(alias).filter(job_id=probe.pk).exists())
    job = tasks.GivesUpLate().enqueue(using=alias)
    wait_until(
        lambda: Job.objects.using(alias).get(pk=job.pk).state == venturi.State.FAILED,
        message="the job to give up",
    )
    job.refresh_from_db()
    outcomes = journal(alias, job)
    # Each run takes 0.3 s: a few retries fit in the 1 s before it gives up.
    assert outcomes[-1] == "failed" and set(outcomes[:-1]) == {"retry"}
    assert 2 <= len(outcomes) <= 6
    assert "give_up_after" in job.last_error


def test_a_handler_that_returns_no_outcome_fails_permanently(alias: str, workers: Workers) -> None:
    job = tasks.ReturnsNone().enqueue(using=alias)
    workers.burst(alias)
    job.refresh_from_db()
    assert job.state == venturi.State.FAILED
    assert "tests.testapp.tasks.ReturnsNone.handle returned NoneType" in job.last_error


def test_a_handler_calling_sys_exit_is_a_failed_run_not_a_dead_worker(
    alias: str, workers: Workers
) -> None:
    exits = tasks.Exits().enqueue(using=alias)
    after = tasks.Noop(n=1).enqueue(using=alias)
    workers.burst(alias, "--concurrency", "1")
    exits.refresh_from_db()
    after.refresh_from_db()
    assert journal(alias, exits) == ["retry", "failed"]
    assert exits.state == venturi.State.FAILED and "SystemExit" in exits.last_error
    assert after.state == venturi.State.COMPLETED


def test_async_handlers_run_on_the_event_loop(alias: str, workers: Workers) -> None:
    jobs = venturi.enqueue_many([tasks.AsyncTask(n=i) for i in range(20)], using=alias)
    workers.burst(alias, "--concurrency", "5")
    assert Job.objects.using(alias).filter(state=venturi.State.COMPLETED).count() == 20
    assert sorted(Record.objects.using(alias).values_list("value", flat=True)) == list(range(20))
    assert len(jobs) == 20


def test_a_payload_that_no_longer_fits_fails_permanently_and_the_worker_goes_on(
    alias: str, workers: Workers
) -> None:
    broken = tasks.Noop(n=1).enqueue(using=alias)
    Job.objects.using(alias).filter(pk=broken.pk).update(payload={"n": "one", "extra": 1})
    fine = tasks.Noop(n=2).enqueue(using=alias)
    workers.burst(alias)
    broken.refresh_from_db()
    fine.refresh_from_db()
    assert broken.state == venturi.State.FAILED
    assert "does not fit tests.testapp.tasks.Noop" in broken.last_error
    assert fine.state == venturi.State.COMPLETED


def test_unknown_kinds_are_not_claimed(alias: str, workers: Workers) -> None:
    job = tasks.Noop().enqueue(using=alias)
    Job.objects.using(alias).filter(pk=job.pk).update(kind="os.system")
    workers.burst(alias)
    job.refresh_from_db()
    assert job.state == venturi.State.READY and job.attempt == 0


def test_delayed_jobs_wait_and_queues_are_served_as_asked(alias: str, workers: Workers) -> None:
    from datetime import timedelta

    later = tasks.Noop(n=1).enqueue(delay=timedelta(hours=1), using=alias)
    other = tasks.Noop(n=2).enqueue(queue="other", using=alias)
    mine = tasks.Noop(n=3).enqueue(queue="mine", using=alias)
    workers.burst(alias, "--queues", "mine,default")
    states = {job.pk: Job.objects.using(alias).get(pk=job.pk).state for job in (later, other, mine)}
    assert states == {
        later.pk: venturi.State.READY,
        other.pk: venturi.State.READY,
        mine.pk: venturi.State.COMPLETED,
    }


def test_many_jobs_each_run_exactly_once(alias: str, workers: Workers) -> None:
    venturi.enqueue_many([tasks.Noop(n=i) for i in range(300)], using=alias)
    workers.burst(alias, "--concurrency", "8")
    values = list(Record.objects.using(alias).values_list("value", flat=True))
    assert sorted(values) == list(range(300))
    assert Job.objects.using(alias).exclude(state=venturi.State.COMPLETED).count() == 0
