"""What a handler run can end with: completed, paused, retry or failed."""

from __future__ import annotations

import dataclasses
import enum
from datetime import timedelta
from typing import Any

from django_venturi.store.backoff import checked_delay


class OutcomeKind(enum.StrEnum):
    """The four results a handler can return (the journal adds worker-side ones)."""

    COMPLETED = "completed"
    PAUSED = "paused"
    RETRY = "retry"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """The result of one handler run. Build it with the class methods."""

    kind: OutcomeKind
    """Which of the four outcomes this is."""
    carry: Any = None
    """The checkpoint handed to the next run (paused only)."""
    after: timedelta | None = None
    """How long to wait before the next run (paused and retry); cut to `MAX_DELAY` (100 years).
    The class methods also take a number of seconds (int or float) and store it as a timedelta."""
    result: Any = None
    """What the job produced (completed only): plain JSON, stored in `Job.result` and
    read by the jobs enqueued after it (`ctx.dependency_results()`)."""
    reason: str = ""
    """Why the job failed (failed only). Characters PostgreSQL cannot store (NUL,
    surrogates) are replaced when the journal records it: see `django_venturi.payloads.text`."""

    def __post_init__(self) -> None:
        if self.after is not None and not isinstance(self.after, timedelta):
            # Seconds become a timedelta; bools, NaN, infinities and other types are refused.
            object.__setattr__(self, "after", checked_delay(self.after, "Outcome: after"))
        if not isinstance(self.reason, str):
            raise TypeError(
                f"Outcome.failed: reason must be a str, got {type(self.reason).__name__}"
            )

    @classmethod
    def completed(cls, result: Any = None) -> Outcome:
        """Finish the job successfully, storing `result` if given.

        `result` must be plain JSON (str, int, float, bool, None, lists and dicts of
        them, dicts keyed by str), checked as a payload's untyped fields are; a result
        that does not fit fails the job permanently.
        """
        if result is None and cls is Outcome:
            return _COMPLETED  # the common return of every tiny job, made once
        return cls(OutcomeKind.COMPLETED, result=result)

    @classmethod
    def paused(cls, carry: Any, after: timedelta | float | None = None) -> Outcome:
        """Checkpoint: run again after `after` (default: at once) with `ctx.carry = carry`.

        `after` is a timedelta or a number of seconds (a negative one: at once).

        A pause does not count against `max_attempts`.
        """
        return cls(OutcomeKind.PAUSED, carry=carry, after=_seconds_or_timedelta(after))

    @classmethod
    def retry(cls, after: timedelta | float | None = None) -> Outcome:
        """A retryable failure: run again after `after` (default: the task's backoff).

        `after` is a timedelta or a number of seconds (a negative one: at once).
        """
        return cls(OutcomeKind.RETRY, after=_seconds_or_timedelta(after))

    @classmethod
    def failed(cls, reason: str) -> Outcome:
        """A permanent failure: the job ends `failed` and is not retried."""
        return cls(OutcomeKind.FAILED, reason=reason)


_COMPLETED = Outcome(OutcomeKind.COMPLETED)


def _seconds_or_timedelta(after: timedelta | float | None) -> timedelta | None:
    return None if after is None else checked_delay(after, "Outcome: after")


class TaskError(Exception):
    """Raise from a handler to fail the job; see `TaskError.permanent`."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.is_permanent = permanent

    @classmethod
    def permanent(cls, reason: str) -> TaskError:
        """Build an error that fails the job permanently (no retry)."""
        return cls(reason, permanent=True)
