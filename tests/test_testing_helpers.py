"""`django_venturi.testing`, used the way a project's own test suite would use it.

Only the public helpers and pytest-django's `db` fixture: no worker, no fixture of ours.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_venturi.testing import (
    DrainLimitReached,
    VenturiQueue,
    assert_enqueued,
    drain,
    eager,
    enqueued,
    venturi_queue,  # noqa: F401 - the fixture, imported as a user's conftest would
)
from tests.testapp.models import Record
from tests.testapp.tasks import AsyncTask, Flaky, Noop, Permanent


def test_eager_runs_the_job_at_enqueue(db: None) -> None:
    with eager():
        job = Noop(n=7).enqueue()
    assert job.state == "completed"
    assert list(Record.objects.values_list("value", flat=True)) == [7]
    assert list(job.journal.values_list("outcome", "worker")) == [("completed", "testing")]


def test_eager_by_setting_and_async_handlers(db: None, settings: object) -> None:
    settings.VENTURI = {**settings.VENTURI, "TESTING_EAGER": True}  # type: ignore[attr-defined]
    job = AsyncTask(n=3).enqueue()
    assert job.state == "completed"
    assert Record.objects.get(kind="async").value == 3


def test_eager_leaves_failures_to_the_job_not_to_the_caller(db: None) -> None:
    with eager():
        job = Permanent().enqueue()
    assert job.state == "failed"
    assert "the address does not exist" in job.last_error


def test_drain_runs_every_due_job_and_returns_the_outcomes(db: None) -> None:
    Noop(n=1).enqueue()
    Flaky(failures=1).enqueue()  # fails once, retried at once (zero backoff)
    later = Noop(n=2).enqueue(delay=timedelta(hours=1))

    ran = drain()

    assert [(r.kind, r.outcome) for r in ran] == [
        ("tests.noop", "completed"),
        ("tests.flaky", "retry"),
        ("tests.flaky", "completed"),
    ]
    assert "flaky failure 1" in ran[1].error
    later.refresh_from_db()
    assert later.state == "ready"  # not due yet: not run
    assert drain() == []


def test_drain_stops_at_its_limit_and_says_so_in_words(db: None) -> None:
    Noop(n=1).enqueue()
    Noop(n=2).enqueue()
    with pytest.raises(DrainLimitReached, match=r"drain\(\) ran 1 job and more are due"):
        drain(limit=1)


def test_drain_runs_only_the_kinds_it_is_given(db: None) -> None:
    Noop().enqueue()
    Permanent().enqueue()
    assert [r.kind for r in drain([Noop])] == ["tests.noop"]
    assert [(r.kind, r.state) for r in drain(["tests.permanent"])] == [
        ("tests.permanent", "failed")
    ]


def test_enqueued_and_assert_enqueued(db: None) -> None:
    Noop(n=1).enqueue()
    Noop(n=2).enqueue()
    assert enqueued(Noop) == [Noop(n=1), Noop(n=2)]
    assert enqueued(Noop, n=2) == [Noop(n=2)]
    assert_enqueued(Noop, n=1)
    assert_enqueued(Noop, count=2)
    with pytest.raises(AssertionError, match=r"expected Noop job\(s\) with n=3, found 0"):
        assert_enqueued(Noop, n=3)
    with pytest.raises(TypeError, match="Noop has no field m"):
        enqueued(Noop, m=1)


def test_the_venturi_queue_fixture_sees_enqueued_jobs_and_drains_them(
    venturi_queue: VenturiQueue,  # noqa: F811
) -> None:
    Noop(n=5).enqueue()
    venturi_queue.assert_enqueued(Noop, n=5)
    assert [r.outcome for r in venturi_queue.drain()] == ["completed"]
    assert venturi_queue.enqueued(Noop, n=5) == [Noop(n=5)]
