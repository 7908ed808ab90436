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


def assert_sequential(intervals: list[tuple[datetime, datetime]], nap: float = NAP) -> None:
    """Runs of one slot: one after another, each at least as long as its handler.

    Only lower bounds: a busy machine delays a start or a verdict write by any amount,
    never hastens one. Dated from the claim, the buffered runs would share one start
    and fail the second loop's bound."""
    intervals = sorted(intervals)
    for started, finished in intervals:
        assert finished - started >= timedelta(seconds=nap)
    for (started, _), (next_started, _) in pairwise(intervals):
        assert next_started >= started + timedelta(seconds=nap) - SHIFT


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
