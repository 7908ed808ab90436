from datetime import timedelta

import pytest

from django_venturi.backoff import Fibonacci, fibonacci


def test_fibonacci_numbers() -> None:
    assert [fibonacci(n) for n in range(1, 11)] == [1, 1, 2, 3, 5, 8, 13, 21, 34, 55]


def test_delay_grows_like_fibonacci_within_the_jitter() -> None:
    backoff = Fibonacci(base=timedelta(seconds=10), cap=timedelta(hours=10))
    for failures, nominal in [(1, 10), (2, 10), (3, 20), (4, 30), (5, 50), (6, 80)]:
        delay = backoff.delay(job_id=7, failures=failures).total_seconds()
        assert nominal * 0.9 <= delay <= nominal * 1.1


def test_jitter_is_deterministic_per_job_and_attempt() -> None:
    backoff = Fibonacci()
    first = [backoff.delay(job_id=12, failures=n) for n in range(1, 8)]
    assert first == [backoff.delay(job_id=12, failures=n) for n in range(1, 8)]
    spread = {backoff.delay(job_id=job_id, failures=5) for job_id in range(50)}
    assert len(spread) > 40  # different jobs do not retry in lockstep


def test_delay_never_exceeds_the_cap() -> None:
    backoff = Fibonacci(base=timedelta(seconds=1), cap=timedelta(minutes=1))
    assert all(backoff.delay(job_id=i, failures=40) <= timedelta(minutes=1) for i in range(100))


def test_invalid_backoff_is_refused() -> None:
    with pytest.raises(ValueError, match="cap"):
        Fibonacci(base=timedelta(seconds=5), cap=timedelta(seconds=1))
