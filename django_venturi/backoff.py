"""Retry delays: Fibonacci growth with deterministic, RNG-free jitter."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import timedelta

JITTER = 0.1
"""Delays are spread over +/- 10 % of their nominal value."""


def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number with fib(1) = fib(2) = 1 (fib(0) = 0)."""
    previous, current = 0, 1
    for _ in range(max(n, 0)):
        previous, current = current, previous + current
    return previous


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
        if self.base < timedelta(0):
            raise ValueError("Fibonacci.base must not be negative")
        if self.cap < self.base:
            raise ValueError("Fibonacci.cap must be at least Fibonacci.base")

    def delay(self, *, job_id: int, failures: int) -> timedelta:
        """Return how long to wait before the next run after `failures` failures."""
        nominal = min(self.base * fibonacci(max(failures, 1)), self.cap)
        spread = 1 - JITTER + 2 * JITTER * jitter_fraction(job_id, failures)
        return min(nominal * spread, self.cap)
