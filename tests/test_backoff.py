from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_venturi.store.backoff import (
    MAX_DELAY,
    Fibonacci,
    clamp_delay,
    fibonacci,
    fibonacci_at_most,
)


def test_fibonacci_gives_the_numbers_the_backoff_grows_by() -> None:
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


# ---------------------------------------------------------------- no overflow, ever

BASES = st.timedeltas(min_value=timedelta(milliseconds=1), max_value=timedelta(days=1))


@st.composite
def backoffs(draw: st.DrawFn) -> Fibonacci:
    """Bases from 1 ms to 1 day; caps from the base up to the longest timedelta."""
    base = draw(BASES)
    cap = draw(st.one_of(st.timedeltas(min_value=base), st.just(timedelta.max)))
    return Fibonacci(base=base, cap=cap)


@given(backoffs(), st.integers(min_value=0, max_value=10_000), st.integers(min_value=1))
def test_delay_never_raises_never_passes_the_cap_and_is_never_negative(
    backoff: Fibonacci, failures: int, job_id: int
) -> None:
    delay = backoff.delay(job_id=job_id, failures=failures)
    assert timedelta(0) <= delay <= backoff.cap


@given(backoffs(), st.integers(min_value=0, max_value=10_000))
def test_the_delay_before_jitter_grows_with_failures(backoff: Fibonacci, failures: int) -> None:
    assert backoff.nominal(failures) <= backoff.nominal(failures + 1) <= backoff.cap


def test_the_overflow_of_fibonacci_69_is_gone() -> None:
    backoff = Fibonacci(base=timedelta(seconds=1), cap=timedelta(hours=1))
    for failures in (68, 69, 70, 1000, 10**9):
        assert backoff.nominal(failures) == timedelta(hours=1)
        assert timedelta(minutes=54) <= backoff.delay(job_id=1, failures=failures) <= backoff.cap
    assert Fibonacci(base=timedelta(days=1), cap=timedelta.max).nominal(10**9) == timedelta.max


def test_nominal_delays_are_base_times_fibonacci_below_the_cap() -> None:
    backoff = Fibonacci(base=timedelta(milliseconds=3), cap=timedelta(days=1))
    assert [backoff.nominal(n) for n in range(1, 7)] == [
        timedelta(milliseconds=3 * f) for f in (1, 1, 2, 3, 5, 8)
    ]
    assert fibonacci_at_most(10, 40) == 41 and fibonacci_at_most(10, 55) == 55


@given(st.timedeltas())
def test_a_handler_s_delay_is_cut_to_what_the_database_can_hold(delay: timedelta) -> None:
    clamped = clamp_delay(delay)
    assert timedelta(0) <= clamped <= MAX_DELAY
    assert clamped == delay or delay < timedelta(0) or delay > MAX_DELAY
