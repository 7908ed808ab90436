"""What a handler sees about its job while it runs."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from django.utils import timezone

from django_venturi.payloads.codec import int_problem
from django_venturi.payloads.text import storable
from django_venturi.store.connections import closing_broken_on_error

if TYPE_CHECKING:
    from django_venturi.models import JournalEntry

PROGRESS_NOTE_LIMIT = 200


class StopSignal(Protocol):
    """Anything with `is_set()`: a `threading.Event`, or a worker's cheaper `Flag`."""

    def is_set(self) -> bool: ...


class Flag:
    """A flag set once by one thread and read by others: an Event nobody waits on.

    A `threading.Event` builds a Condition and a Lock; a worker makes three of
    these per job, and that was a fifth of its CPU time on tiny jobs.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


_NEVER = Flag()


def _check_number(value: object, name: str, expected: str = "a number") -> None:
    """A progress figure must be a number that JSON, and so the database, can hold."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"progress: {name} must be {expected}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"progress: {name} must be finite, got {value!r}")
    problem = int_problem(value) if isinstance(value, int) else None
    if problem:
        raise ValueError(f"progress: {name} {problem}")


class Context:
    """The running job as its handler sees it: identity, checkpoint and stop signal.

    `should_stop` is the one contract a long handler must honour: when it turns
    true (the worker is shutting down, or this worker lost the job's lease),
    return soon, ideally `Outcome.paused(carry)` with a checkpoint. A handler
    that ignores it keeps running until the shutdown timeout; then its job is
    released back to the queue and its late result is discarded.

    `should_stop` also turns true when the job is cancelled (`cancel_requested`):
    whatever the handler then returns, the job ends `cancelled`; and when the
    run passes its task's `timeout` (`timed_out`): a sync handler that has not
    returned within `TIMEOUT_GRACE` is abandoned and the run ends `timeout`.
    """

    def __init__(
        self,
        *,
        job_id: int,
        attempt: int,
        carry: Any,
        enqueued_at: datetime,
        database: str,
        stop: StopSignal,
        lease_lost: StopSignal,
        heartbeat: Callable[[], bool],
        cancel_requested: StopSignal | None = None,
        timed_out: StopSignal | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.job_id = job_id
        """The id of the job's row."""
        self.attempt = attempt
        """Runs started so far, this one included (1 on the first run)."""
        self.carry = carry
        """The checkpoint the previous run paused with, or None."""
        self.enqueued_at = enqueued_at
        """When the job was first enqueued (database time)."""
        self.database = database
        """The database alias that holds the job."""
        self._stop = stop
        self._lease_lost = lease_lost
        self._heartbeat = heartbeat
        self._cancel_requested = cancel_requested or _NEVER
        self._timed_out = timed_out or _NEVER
        self._on_progress = on_progress
        self._journal: list[JournalEntry] | None = None

    @property
    def should_stop(self) -> bool:
        """True once the worker asks handlers to stop, or this run lost its lease."""
        return (
            self._stop.is_set()
            or self._lease_lost.is_set()
            or self._cancel_requested.is_set()
            or self._timed_out.is_set()
        )

    @property
    def cancel_requested(self) -> bool:
        """True once `venturi.cancel()` asked for this job: it ends `cancelled` when you return."""
        return self._cancel_requested.is_set()

    @property
    def timed_out(self) -> bool:
        """True once this run passed its task's `timeout`: return now (a checkpoint if you can)."""
        return self._timed_out.is_set()

    def progress(self, done: float, total: float | None = None, note: str = "") -> None:
        """Record how far the run is: cheap, written at most once a second, and with the verdict.

        `done` and `total` are finite numbers (`total` None when unknown); `note` a short
        text, cut to 200 characters, with NUL and surrogates replaced (`text.storable`).
        """
        _check_number(done, "done")
        if total is not None:
            _check_number(total, "total", "a number or None")
        if not isinstance(note, str):
            raise TypeError(f"progress: note must be a str, got {type(note).__name__}")
        if self._on_progress is not None:
            self._on_progress(
                {
                    "done": done,
                    "total": total,
                    "note": storable(note[:PROGRESS_NOTE_LIMIT]),
                    "at": timezone.now().isoformat(),
                }
            )

    @property
    def lease_lost(self) -> bool:
        """True when another worker may have taken the job over: stop, nothing will be saved."""
        return self._lease_lost.is_set()

    def heartbeat(self) -> bool:
        """Extend this job's lease now; return False if the lease is already lost."""
        return self._heartbeat()

    async def aheartbeat(self) -> bool:
        """`heartbeat()` for `async def` handlers."""
        from asgiref.sync import sync_to_async

        heartbeat = closing_broken_on_error(self._heartbeat)
        return await sync_to_async(heartbeat, thread_sensitive=False)()

    def dependency_results(self) -> dict[int, Any]:
        """`{job_id: result}` of the jobs this one was enqueued after (`enqueue(after=...)`).

        A result is what the job's `Outcome.completed(result=...)` stored, or None
        (no result, or a dependency that did not complete, with `after_failure="run"`).
        A dependency deleted by cleanup is missing.
        """
        from django_venturi.models import Dependency

        return dict(
            Dependency.objects.using(self.database)
            .filter(dependent_id=self.job_id)
            .order_by("dependency_id")
            .values_list("dependency_id", "dependency__result")
        )

    async def adependency_results(self) -> dict[int, Any]:
        """`dependency_results()` for `async def` handlers."""
        from asgiref.sync import sync_to_async

        results = closing_broken_on_error(self.dependency_results)
        return await sync_to_async(results, thread_sensitive=False)()

    async def ajournal(self) -> list[JournalEntry]:
        """`journal` for `async def` handlers."""
        from asgiref.sync import sync_to_async

        journal = closing_broken_on_error(lambda: self.journal)
        return await sync_to_async(journal, thread_sensitive=False)()

    @property
    def journal(self) -> list[JournalEntry]:
        """The earlier executions of this job, oldest first (read once, on first use)."""
        if self._journal is None:
            from django_venturi.models import JournalEntry

            self._journal = list(
                JournalEntry.objects.using(self.database).filter(job_id=self.job_id).order_by("id")
            )
        return self._journal
