"""A run is dated from its handler's start, not from the claim that buffered it."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise

import pytest

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from tests.conftest import Workers
from tests.testapp.tasks import Steady

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

NAP = 0.3
SHIFT = timedelta(seconds=0.05)
"""One slot: each run starts at least a handler's run after the previous one (less the
few milliseconds the claim's round trip can shift a start by)."""
SLACK = timedelta(seconds=0.25)
"""What a duration may add to the handler's own run: the verdict write, a busy machine."""
WRITE_SLACK = timedelta(seconds=0.15)
"""`finished_at` is the verdict write's time: the next run may start before it."""


def assert_sequential(intervals: list[tuple[datetime, datetime]], nap: float = NAP) -> None:
    """Runs of one slot: one after another, each about as long as its handler."""
    intervals = sorted(intervals)
    for started, finished in intervals:
        assert timedelta(seconds=nap) <= finished - started < timedelta(seconds=nap) + SLACK
    for (started, finished), (next_started, _) in pairwise(intervals):
        assert next_started >= started + timedelta(seconds=nap) - SHIFT
        assert next_started >= finished - WRITE_SLACK


def test_buffered_jobs_are_dated_from_their_handlers_start(alias: str, workers: Workers) -> None:
    jobs = venturi.enqueue_many([Steady(n=i, sleep=NAP) for i in range(4)], using=alias)

    workers.burst(alias, "--concurrency", "1")

    ids = [job.id for job in jobs]
    entries = JournalEntry.objects.using(alias).filter(job_id__in=ids)
    assert sorted(entry.outcome for entry in entries) == ["completed"] * 4
    assert_sequential([(entry.started_at, entry.finished_at) for entry in entries])
    rows = Job.objects.using(alias).filter(id__in=ids)
    assert_sequential([(row.started_at, row.finished_at) for row in rows])
    started = {entry.job_id: entry.started_at for entry in entries}
    assert {row.id: row.started_at for row in rows} == started
