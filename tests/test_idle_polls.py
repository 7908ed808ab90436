"""Polling workers (SQLite, MariaDB, MySQL): idle looks soon after jobs flowed, then
doubling up to POLL_INTERVAL (`worker/idle_polls.py`)."""

from __future__ import annotations

import pytest

from django_venturi.worker.idle_polls import IdlePolls


def test_a_worker_that_just_started_polls_at_the_interval() -> None:
    polls = IdlePolls(1.0)
    assert [polls.next_wait() for _ in range(3)] == [1.0, 1.0, 1.0]


def test_after_jobs_flowed_the_waits_double_from_a_sixteenth_to_the_interval() -> None:
    polls = IdlePolls(1.6)
    polls.jobs_flowed()
    waits = [polls.next_wait() for _ in range(7)]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 1.6, 1.6])
    polls.jobs_flowed()
    assert polls.next_wait() == pytest.approx(0.1)


def test_a_poll_interval_that_is_not_positive_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="poll_interval must be positive, got 0"):
        IdlePolls(0)
