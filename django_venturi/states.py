"""The vocabulary: job states, journal outcomes and priority tiers."""

from __future__ import annotations

from django.db import models


class State(models.TextChoices):
    """Where a job is in its life (see the lifecycle in docs/guide.md)."""

    WAITING = "waiting", "waiting"
    """Waiting for its dependencies (`enqueue(after=...)`) to complete; never claimed."""
    READY = "ready", "ready"
    """Waiting to be claimed; `run_at` may be in the future."""
    RUNNING = "running", "running"
    """Claimed by a worker that holds its lease."""
    COMPLETED = "completed", "completed"
    """Finished successfully."""
    FAILED = "failed", "failed"
    """Failed permanently, or gave up after too many failures."""
    CANCELLED = "cancelled", "cancelled"
    """Finished without running to the end: cancelled, or folded into another job."""


FINISHED_STATES = (State.COMPLETED, State.FAILED, State.CANCELLED)
LIVE_STATES = (State.WAITING, State.READY, State.RUNNING)


class JournalOutcome(models.TextChoices):
    """How one execution ended, as written in its journal entry."""

    COMPLETED = "completed", "completed"
    """The handler returned `Outcome.completed()`."""
    PAUSED = "paused", "paused"
    """The handler returned `Outcome.paused(...)`; not a failure."""
    RETRY = "retry", "retry"
    """The handler raised or returned `Outcome.retry()`; a failed run, retried after backoff."""
    FAILED = "failed", "failed"
    """A permanent failure, or a failure that gave up."""
    LEASE_EXPIRED = "lease_expired", "lease expired"
    """The worker vanished; another worker recovered the job."""
    RELEASED = "released", "released"
    """Handed back at shutdown; not counted as a failure."""
    CANCELLED = "cancelled", "cancelled"
    """The run ended after a cancel was asked; the job is `cancelled`."""
    TIMEOUT = "timeout", "timeout"
    """The handler ran past its task's timeout; a retryable failure."""
    DISCARDED = "discarded", "discarded"
    """A late result from a worker that had lost its claim; not applied."""


class Priority(models.IntegerChoices):
    """Three tiers; lower values are claimed first, with weighted slots for each tier."""

    HIGH = 0, "high"
    NORMAL = 1, "normal"
    LOW = 2, "low"
