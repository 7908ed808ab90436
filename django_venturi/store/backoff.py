"""Retry delays: Fibonacci growth with deterministic, RNG-free jitter."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from datetime import timedelta

JITTER = 0.1
"""Delays are spread over +/- 10 % of their nominal value."""
MAX_DELAY = timedelta(days=36_525)
"""The longest wait before a job runs again (100 years): longer ones are cut to it.

`now() + delay` must stay a date both PostgreSQL and Python can hold (Python's
end at year 9999), whatever a task's backoff `cap` or a handler's `after=` says.
"""

_MICROSECOND = timedelta(microseconds=1)


def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number with fib(1) = fib(2) = 1 (fib(0) = 0)."""
    previous, current = 0, 1
    for _ in range(max(n, 0)):
        previous, current = current, previous + current
    return previous


def fibonacci_at_most(n: int, limit: int) -> int:
    """Return min(fib(n), limit + 1): stops as soon as fib passes `limit`, whatever `n` is."""
    previous, current = 0, 1
    for _ in range(max(n, 0)):
        if previous > limit:
            return limit + 1
        previous, current = current, previous + current
    return min(previous, limit + 1)


def clamp_delay(delay: timedelta | None) -> timedelta:
    """`delay` within [0, MAX_DELAY]: None and negative delays are 0 (run at once)."""
    if delay is None or delay < timedelta(0):
        return timedelta(0)
    return min(delay, MAX_DELAY)


def checked_delay(value: object, name: str, *, longest: timedelta | None = None) -> timedelta:
    """`value`, a timedelta or a number of seconds (int or float), as a timedelta.

    Raise naming `name`: a `TypeError` for any other type (a bool too), a
    `ValueError` for NaN, an infinity, a number of seconds past what a timedelta
    holds, or a value further from zero than `longest` (when given). A negative
    delay stays allowed: it means at once (a deadline already passed), as it always did.
    """
    if isinstance(value, timedelta):
        delay: timedelta | None = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if value != value or value in (math.inf, -math.inf):
            raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        try:
            delay = timedelta(seconds=value)
        except OverflowError:  # past timedelta's 999,999,999 days, either way
            delay = None
    else:
        kind = type(value).__name__
        raise TypeError(f"{name} must be a timedelta, a number of seconds or None, got {kind}")
    if longest is not None and (delay is None or not -longest <= delay <= longest):
        raise ValueError(
            f"{name} must be within {longest.days} days (MAX_DELAY), got {_shown(value)}"
        )
    if delay is None:
        raise ValueError(
            f"{name} must be at most 999999999 days (a timedelta), got {_shown(value)}"
        )
    return delay


def _shown(value: timedelta | float) -> str:
    """A delay for an error message: a timedelta as it prints, seconds by `_seconds`."""
    return str(value) if isinstance(value, timedelta) else _seconds(value)


def _seconds(value: float) -> str:
    """A number of seconds for an error message, a huge integer by its length only."""
    if isinstance(value, int) and value.bit_length() > 64:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"an integer of about {digits} digits (seconds)"
    return f"{value!r} seconds"


def jitter_fraction(job_id: int, attempt: int) -> float:
    """Map (job id, attempt) to a stable number in [0, 1): same inputs, same delay."""
    digest = hashlib.blake2b(f"{job_id}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclasses.dataclass(frozen=True, slots=True)
class Fibonacci:
    """Delay `base * fib(failures)`, capped at `cap`, jittered by +/- 10 %."""

    base: timedelta = timedelta(seconds=1)
    """The delay after the first failure."""
    cap: timedelta = timedelta(hours=1)
    """No delay is longer than this."""

    def __post_init__(self) -> None:
        if not isinstance(self.base, timedelta) or not isinstance(self.cap, timedelta):
            raise TypeError("Fibonacci.base and Fibonacci.cap must be timedeltas")
        if self.base < timedelta(0):
            raise ValueError("Fibonacci.base must not be negative")
        if self.cap < self.base:
            raise ValueError("Fibonacci.cap must be at least Fibonacci.base")

    def nominal(self, failures: int) -> timedelta:
        """The delay after `failures` failures before jitter: `base * fib(failures)`, capped.

        Computed in whole microseconds and compared with the cap before it can
        grow past it, so no number of failures overflows a `timedelta`.
        """
        base = self.base // _MICROSECOND
        cap = self.cap // _MICROSECOND
        if base == 0:
            return timedelta(0)
        factor = fibonacci_at_most(max(failures, 1), cap // base)
        return timedelta(microseconds=min(base * factor, cap))

    def delay(self, *, job_id: int, failures: int) -> timedelta:
        """Return how long to wait before the next run after `failures` failures."""
        nominal = self.nominal(failures) // _MICROSECOND
        spread = 1 - JITTER + 2 * JITTER * jitter_fraction(job_id, failures)
        cap = self.cap // _MICROSECOND
        return timedelta(microseconds=min(round(nominal * spread), cap))
