"""Task timeouts: ask a run past its `timeout` to stop, then give up on it.

Python cannot stop a thread from outside. So a sync handler past its task's
`timeout` is first asked to stop (`ctx.should_stop`, `ctx.timed_out`); if it
has not returned `TIMEOUT_GRACE` later, the worker stops waiting for it: the
run is journalled `timeout` (a retryable failure under the task's backoff and
`max_attempts`), and the thread, still running, is counted as lost until it
returns; its late result is dropped (and the claim-token fence would refuse it
anyway). A replacement thread takes the slot, up to `concurrency` lost threads
at once; past that the worker runs with fewer slots until lost threads return.

An `async def` handler is cancelled at its timeout (`asyncio.timeout`), no
grace: the cancellation reaches it at its next `await`; one that blocks the
event loop without awaiting cannot be cancelled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django_venturi.conf import venturi_settings
from django_venturi.registry import UnknownKind, registry
from django_venturi.worker.execution import Execution

logger = logging.getLogger("django_venturi.worker")

CHECK_INTERVAL = 0.1
"""Seconds between two looks at the running handlers."""


class Watchdog:
    """A thread that watches running handlers against their task's timeout."""

    def __init__(
        self,
        *,
        executing: Callable[[], list[Execution]],
        abandon: Callable[[Execution], None],
        stopped: threading.Event,
    ) -> None:
        self._executing = executing
        self._abandon = abandon
        self._stopped = stopped
        self._thread = threading.Thread(target=self._run, name="venturi-timeouts", daemon=True)

    def start(self) -> None:
        if any(spec.timeout is not None for spec in registry.specs()):
            self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(CHECK_INTERVAL):
            try:
                self.check(time.monotonic())
            except Exception:  # a failed look must not end the watching
                logger.exception("the timeout watchdog's check failed; it goes on")

    def check(self, now: float) -> None:
        """Flag the runs past their timeout; abandon the sync ones past the grace too."""
        grace = venturi_settings.TIMEOUT_GRACE.total_seconds()
        for execution in self._executing():
            if execution.started is None:
                continue
            try:
                spec = registry.get(execution.job.kind)
            except UnknownKind:
                continue
            if spec.timeout is None:
                continue
            overdue = now - execution.started - spec.timeout.total_seconds()
            if overdue < 0:
                continue
            execution.timed_out.set()
            if overdue >= grace and not spec.is_async:
                self._abandon(execution)
