"""`delay=` and `Outcome.paused/retry(after=)` take seconds (int or float) as well as a
timedelta; bools, NaN, infinities and overflowing values are refused naming the
parameter. A negative delay (a deadline already passed) means at once, as it always has."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.utils import timezone

import django_venturi as venturi
from django_venturi import testing
from django_venturi.models import Job
from django_venturi.store.backoff import MAX_DELAY
from tests.testapp.limit_tasks import Waits
from tests.testapp.tasks import Noop


def waited(alias: str, job: Job) -> timedelta:
    stored = Job.objects.using(alias).get(pk=job.pk)
    return stored.run_at - stored.enqueued_at


def on_commit(alias: str, delay: object) -> Job:
    with transaction.atomic(using=alias):
        Noop(n=1).enqueue_on_commit(delay=delay, using=alias)  # type: ignore[arg-type]
    return Job.objects.using(alias).latest("id")


def asynchronously(alias: str, delay: object) -> Job:
    try:
        return asyncio.run(Noop(n=1).aenqueue(delay=delay, using=alias))  # type: ignore[arg-type]
    finally:
        asyncio.run(sync_to_async(connections.close_all)())  # the executor thread's connection


PATHS: dict[str, Callable[[str, object], Job]] = {
    "enqueue": lambda alias, delay: Noop(n=1).enqueue(delay=delay, using=alias),  # type: ignore[arg-type]
    "enqueue_on_commit": on_commit,
    "aenqueue": asynchronously,
    "enqueue_many_one": lambda alias, delay: venturi.enqueue_many(
        [Noop(n=1)], delay=delay, using=alias
    )[0],
    "enqueue_many_batch": lambda alias, delay: venturi.enqueue_many(
        [Noop(n=1), Noop(n=2)], delay=delay, using=alias
    )[1],
}


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_delay_in_seconds_waits_as_long_as_the_same_timedelta(alias: str, path: str) -> None:
    enqueue = PATHS[path]
    for seconds in (90, 90.0, 0.25, 0):
        as_number = enqueue(alias, seconds)
        as_timedelta = enqueue(alias, timedelta(seconds=seconds))
        assert waited(alias, as_number) == waited(alias, as_timedelta) == timedelta(seconds=seconds)


BAD_DELAYS: list[tuple[object, type[Exception], str]] = [
    (math.nan, ValueError, r"delay must be a finite number of seconds, got nan"),
    (math.inf, ValueError, r"delay must be a finite number of seconds, got inf"),
    (-math.inf, ValueError, r"delay must be a finite number of seconds, got -inf"),
    (True, TypeError, r"delay must be a timedelta, a number of seconds or None, got bool"),
    (False, TypeError, r"delay must be a timedelta, a number of seconds or None, got bool"),
    ("5", TypeError, r"delay must be a timedelta, a number of seconds or None, got str"),
    (MAX_DELAY.total_seconds() + 1, ValueError, r"delay must be within 36525 days"),
    (-MAX_DELAY.total_seconds() - 1, ValueError, r"delay must be within 36525 days"),
    (1e300, ValueError, r"delay must be within 36525 days .* got 1e\+300 seconds"),
    (10**400, ValueError, r"delay must be within .* got an integer of about 401 digits"),
    (-(10**5000), ValueError, r"delay must be within .* got an integer of about 5001 digits"),
]


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_bad_delays_are_refused_naming_the_parameter_and_write_nothing(
    alias: str, path: str
) -> None:
    enqueue = PATHS[path]
    for delay, error, message in BAD_DELAYS:
        with pytest.raises(error, match=message):
            enqueue(alias, delay)
    assert not Job.objects.using(alias).exists()
    longest = enqueue(alias, MAX_DELAY.total_seconds())  # the longest delay there is, in seconds
    assert waited(alias, longest) == MAX_DELAY


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_negative_delay_means_at_once(alias: str, path: str) -> None:
    enqueue = PATHS[path]
    for delay in (-1, -0.5, timedelta(seconds=-30)):
        job = enqueue(alias, delay)
        assert waited(alias, job) <= timedelta(0)


def test_outcome_after_takes_seconds_as_a_timedelta() -> None:
    assert venturi.Outcome.retry(after=5).after == timedelta(seconds=5)
    assert venturi.Outcome.retry(after=timedelta(seconds=5)).after == timedelta(seconds=5)
    assert venturi.Outcome.paused("carry", after=0.5).after == timedelta(milliseconds=500)
    assert venturi.Outcome.paused("carry", after=0).after == timedelta(0)
    assert venturi.Outcome.retry().after is None
    assert venturi.Outcome.retry(after=-1).after == timedelta(seconds=-1)  # at once


@pytest.mark.parametrize(
    ("after", "error", "message"),
    [
        (math.nan, ValueError, r"Outcome: after must be a finite number of seconds, got nan"),
        (math.inf, ValueError, r"Outcome: after must be a finite number of seconds, got inf"),
        (True, TypeError, r"Outcome: after must be a timedelta, a number of seconds or None"),
        ("5", TypeError, r"Outcome: after must be .* got str"),
        (1e300, ValueError, r"Outcome: after must be at most 999999999 days .* 1e\+300 seconds"),
    ],
    ids=repr,
)
def test_outcome_after_refuses_bad_values_naming_after(
    after: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        venturi.Outcome.retry(after=after)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        venturi.Outcome.paused(None, after=after)  # type: ignore[arg-type]


@pytest.mark.django_db(databases=["default", "sqlite"])
@pytest.mark.parametrize("pause", [False, True], ids=["retry", "paused"])
def test_a_handler_asking_to_wait_seconds_runs_again_that_much_later(
    alias: str, pause: bool
) -> None:
    job = Waits(seconds=3600.5, pause=pause).enqueue(using=alias)
    testing.drain(using=alias)
    stored = Job.objects.using(alias).get(pk=job.pk)
    assert stored.state == venturi.State.READY
    assert stored.journal.using(alias).get().outcome == ("paused" if pause else "retry")
    # An hour from now (in database time, the transaction's start on PostgreSQL).
    assert abs(stored.run_at - timezone.now() - timedelta(seconds=3600.5)) < timedelta(minutes=1)
