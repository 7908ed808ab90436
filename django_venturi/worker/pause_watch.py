"""A worker's side of pauses: hand back the claimed jobs a new pause covers.

Claims never take paused jobs (the claim reads the pauses itself), but a worker
holds a few claimed jobs ahead of its handler slots. When a queue or kind is
paused, those must not start either: the watch hands them back to the queue
(ready, as at shutdown, not a failure). On PostgreSQL it looks when a pause's
NOTIFY arrives (and after the listener reconnects); elsewhere at every poll
interval.
"""

from __future__ import annotations

import logging
import threading
import time

from django_venturi.store.pauses import paused_names
from django_venturi.worker.execution import Execution
from django_venturi.worker.handlers import Handlers
from django_venturi.worker.runs import Runs

logger = logging.getLogger("django_venturi.worker")


class PauseWatch:
    """Runs in the claim loop; `changed()` may be called from any thread."""

    def __init__(self, *, alias: str, runs: Runs, handlers: Handlers, every: float | None) -> None:
        """`every`: seconds between looks without a notification (None: only when told)."""
        self.alias = alias
        self.runs = runs
        self.handlers = handlers
        self.every = every
        self._changed = threading.Event()
        self._changed.set()
        self._next_look = 0.0

    def changed(self, payload: str | None = None) -> None:
        """A pause or resume happened (or notifications may have been missed)."""
        self._changed.set()

    def due(self) -> bool:
        return self._changed.is_set() or time.monotonic() >= self.next_look

    @property
    def next_look(self) -> float:
        """When to look next without a notification (monotonic time; inf: never)."""
        return float("inf") if self.every is None else self._next_look

    def look(self) -> None:
        """Read the pauses and hand back the buffered jobs they cover."""
        self._changed.clear()
        if self.every is not None:
            self._next_look = time.monotonic() + self.every
        queues, kinds = paused_names(self.alias)
        if not queues and not kinds:
            return

        def covered(execution: Execution) -> bool:
            return execution.job.queue in queues or execution.job.kind in kinds

        handed_back = self.runs.take_queued_where(covered)
        if handed_back:
            self.handlers.release(handed_back, reason="")
            logger.info(
                "handed back %d claimed job%s not started: their queue or kind is paused",
                len(handed_back),
                "" if len(handed_back) == 1 else "s",
            )
