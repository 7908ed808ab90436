"""What a handler run can end with: completed, paused, retry or failed."""

from __future__ import annotations

import dataclasses
import enum
from datetime import timedelta
from typing import Any


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
    """How long to wait before the next run (paused and retry); cut to `MAX_DELAY` (100 years)."""
    result: Any = None
    """What the job produced (completed only): plain JSON, stored in `Job.result` and
    read by the jobs enqueued after it (`ctx.dependency_results()`)."""
    reason: str = ""
    """Why the job failed (failed only). Characters PostgreSQL cannot store (NUL,
    surrogates) are replaced when the journal records it: see `django_venturi.payloads.text`."""

    def __post_init__(self) -> None:
        if self.after is not None and not isinstance(self.after, timedelta):
            kind = type(self.after).__name__
            raise TypeError(f"Outcome: after must be a timedelta or None, got {kind}")
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
    def paused(cls, carry: Any, after: timedelta | None = None) -> Outcome:
        """Checkpoint: run again after `after` (default: at once) with `ctx.carry = carry`.

        A pause does not count against `max_attempts`.
        """
        return cls(OutcomeKind.PAUSED, carry=carry, after=after)

    @classmethod
    def retry(cls, after: timedelta | None = None) -> Outcome:
        """A retryable failure: run again after `after` (default: the task's backoff)."""
        return cls(OutcomeKind.RETRY, after=after)

    @classmethod
    def failed(cls, reason: str) -> Outcome:
        """A permanent failure: the job ends `failed` and is not retried."""
        return cls(OutcomeKind.FAILED, reason=reason)


_COMPLETED = Outcome(OutcomeKind.COMPLETED)


class TaskError(Exception):
    """Raise from a handler to fail the job; see `TaskError.permanent`."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.is_permanent = permanent

    @classmethod
    def permanent(cls, reason: str) -> TaskError:
        """Build an error that fails the job permanently (no retry)."""
        return cls(reason, permanent=True)
