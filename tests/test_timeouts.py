"""Task timeouts, with real workers: ask to stop, then give up on the run and reclaim the slot."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.registry import RegistrationError
from tests.conftest import Workers, wait_until
from tests.testapp.control_tasks import AsyncTimeout, HonoursTimeout, IgnoresTimeout
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def journal(alias: str, job: Job) -> list[str]:
    return list(job.journal.using(alias).order_by("id").values_list("outcome", flat=True))


def values(alias: str, job: Job, kind: str) -> list[object]:
    rows = Record.objects.using(alias).filter(job_id=job.id, kind=kind).order_by("id")
    return [row.value for row in rows]


def test_a_handler_that_ignores_its_timeout_is_abandoned_and_its_slot_reclaimed(
    alias: str, workers: Workers
) -> None:
    # timeout 1 s + TIMEOUT_GRACE 1 s (tests/settings.py); each run would take 6 s.
    job = IgnoresTimeout(seconds=6).enqueue(using=alias)
    workers.start(alias, "--concurrency", "1")
    wait_until(
        lambda: Job.objects.using(alias).get(id=job.id).state == venturi.State.FAILED,
        timeout=30,
        message="both attempts to time out",
    )
    job.refresh_from_db()
    # Two attempts (max_attempts=2), each ended by the timeout; the last one gives up.
    assert journal(alias, job) == ["timeout", "timeout"]
    assert "timeout of 0:00:01 and its grace" in job.last_error
    started = values(alias, job, "ignores_timeout_started")
    assert len(started) == 2
    # With one slot, the second attempt started while the first thread still slept:
    # the abandoned thread did not hold the slot.
    assert started[1] - started[0] < 5  # type: ignore[operator]
    # The late results arrive later and change nothing.
    wait_until(lambda: len(values(alias, job, "ignores_timeout_returned")) == 2, timeout=20)
    wait_until(lambda: workers.log().count("result discarded") == 2, timeout=10)
    job.refresh_from_db()
    assert job.state == venturi.State.FAILED
    assert journal(alias, job) == ["timeout", "timeout"]
    assert "a replacement took its slot" in workers.log()


def test_a_cooperative_handler_sees_should_stop_at_its_timeout(
    alias: str, workers: Workers
) -> None:
    job = HonoursTimeout().enqueue(using=alias)
    workers.burst(alias)
    job.refresh_from_db()
    assert values(alias, job, "honours_timeout") == [{"timed_out": True}]
    assert journal(alias, job) == ["timeout"]
    assert job.state == venturi.State.FAILED


def test_an_async_handler_is_cancelled_at_its_timeout(alias: str, workers: Workers) -> None:
    job = AsyncTimeout().enqueue(using=alias)
    workers.burst(alias, timeout=25)
    job.refresh_from_db()
    assert len(values(alias, job, "async_timeout_cancelled")) == 1
    assert journal(alias, job) == ["timeout"]
    assert job.state == venturi.State.FAILED
    assert "django_venturi.Timeout" in job.last_error


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-1), 5])
def test_timeout_must_be_a_positive_timedelta(bad: object) -> None:
    import dataclasses

    with pytest.raises(RegistrationError, match="timeout must be a positive timedelta"):

        @venturi.task(kind="tests.bad_timeout", timeout=bad)  # type: ignore[arg-type]
        @dataclasses.dataclass
        class BadTimeout:
            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()
