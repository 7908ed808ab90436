"""What a handler sees about its job while it runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_venturi.models import JournalEntry


class Context:
    """The running job as its handler sees it: identity, checkpoint and stop signal.

    `should_stop` is the one contract a long handler must honour: when it turns
    true (the worker is shutting down, or this worker lost the job's lease),
    return soon, ideally `Outcome.paused(carry)` with a checkpoint. A handler
    that ignores it keeps running until the shutdown timeout; then its job is
    released back to the queue and its late result is discarded.
    """

    def __init__(
        self,
        *,
        job_id: int,
        attempt: int,
        carry: Any,
        enqueued_at: datetime,
        database: str,
        stop: threading.Event,
        lease_lost: threading.Event,
        heartbeat: Callable[[], bool],
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
        self._journal: list[JournalEntry] | None = None

    @property
    def should_stop(self) -> bool:
        """True once the worker asks handlers to stop, or this run lost its lease."""
        return self._stop.is_set() or self._lease_lost.is_set()

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

        return await sync_to_async(self._heartbeat, thread_sensitive=False)()

    async def ajournal(self) -> list[JournalEntry]:
        """`journal` for `async def` handlers."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(lambda: self.journal, thread_sensitive=False)()

    @property
    def journal(self) -> list[JournalEntry]:
        """The earlier executions of this job, oldest first (read once, on first use)."""
        if self._journal is None:
            from django_venturi.models import JournalEntry

            self._journal = list(
                JournalEntry.objects.using(self.database).filter(job_id=self.job_id).order_by("id")
            )
        return self._journal
