"""Running handlers: a pool of threads for sync handlers, one event loop for async ones.

Each claimed run is dispatched here and gets exactly one verdict, whatever
happens around its handler: the handler boundary (`Execution.run_sync` and
`run_async`) turns whatever the handler does into a verdict, and a second
boundary here turns a failure of the worker's own code around it (a signal,
a broken connection being closed) into a retryable failure of the run, so no
thread dies and no run is left held but never run.

A sync handler past its timeout and grace is abandoned (`timeouts.Watchdog`):
the run ends `timeout`, a replacement thread takes the slot (up to
`concurrency` lost threads at once), and the late result is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta

from asgiref.sync import sync_to_async
from django import db

from django_venturi import signals
from django_venturi.conf import venturi_settings
from django_venturi.registry import UnknownKind, registry
from django_venturi.states import JournalOutcome
from django_venturi.store import rate_starts, verdicts
from django_venturi.store.connections import JobConnections, close_broken_connections
from django_venturi.store.rate_limits import RateLimit
from django_venturi.store.verdicts import ErrorInfo, Verdict
from django_venturi.worker.execution import Execution
from django_venturi.worker.liveness import HANDLER_POOL, Progress
from django_venturi.worker.results import ResultsWriter
from django_venturi.worker.run_events import RunEvents
from django_venturi.worker.runs import Runs

logger = logging.getLogger("django_venturi.worker")


class Handlers:
    """The handler slots of a worker, and the verdicts of the runs they take."""

    def __init__(
        self,
        *,
        concurrency: int,
        runs: Runs,
        results: ResultsWriter,
        events: RunEvents,
        wake: Callable[[], None],
        progress: Progress | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.progress = progress or Progress()
        self.runs = runs
        self.results = results
        self.events = events
        self._wake = wake
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[Execution | None] = queue.SimpleQueue()
        """Runs waiting for a handler thread (None: a thread's stop marker)."""
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lost_threads = 0
        """Handler threads abandoned past their timeout that have not returned yet."""
        self._unreplaced = 0
        """Of those, how many no replacement thread took over (each is a slot less)."""
        self._mean_duration: float | None = None
        self.wake_at_busy = concurrency
        """A finishing run wakes the claim loop once the runs held in slots and buffer
        number this many or fewer (the loop claims only when that much room is free;
        waking it at every finish cost a thread switch per job)."""
        self.async_connections_checked = True
        """False after a lost database or a failed async run, until `sync_to_async`'s
        thread has closed its broken connections."""

    # ------------------------------------------------------------ the pool

    def start(self) -> None:
        for _ in range(self.concurrency):
            self._add_thread()

    def stop(self) -> None:
        """End the idle threads (busy ones end when their handler returns)."""
        for _ in self._threads:
            self._work.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def slots(self) -> int:
        """Handler slots that can run a job now (less threads lost to timeouts)."""
        with self._lock:
            return self.concurrency - self._unreplaced

    def lost_threads(self) -> int:
        """Handler threads abandoned past their timeout that have not returned yet."""
        with self._lock:
            return self._lost_threads

    @property
    def mean_duration(self) -> float | None:
        """Moving average of handler durations, in seconds (sizes the local buffer)."""
        return self._mean_duration

    def dispatch(self, execution: Execution) -> None:
        self.runs.add(execution)
        if execution.is_async:
            future = asyncio.run_coroutine_threadsafe(
                self._run_async(execution), self._event_loop()
            )
            future.add_done_callback(self._async_done)
        else:
            self._work.put(execution)

    def _add_thread(self) -> None:
        thread = threading.Thread(
            target=self._thread_main, name=f"venturi-handler-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _thread_main(self) -> None:
        kept = JobConnections()
        while True:
            execution = self._work.get()
            if execution is None:
                break
            try:
                self._run_sync(execution, kept)
            except BaseException as error:
                self._failed_around(execution, error)
            if execution.abandoned and execution.replaced:
                break  # a replacement thread holds this slot now
        db.connections.close_all()

    def _run_sync(self, execution: Execution, connections: JobConnections) -> None:
        # The thread's connections are checked first, so that nothing (a round trip,
        # a dropped connection replaced) comes between a rate-limited job's start,
        # recorded by `_rate_limited_start`, and its handler's first line.
        connections.before_job()
        try:
            verdict = self._start_and_run(execution)
        finally:
            connections.after_job()
        if verdict is not None:
            self.finish(execution, verdict)

    def _start_and_run(self, execution: Execution) -> Verdict | None:
        """Start the run and its handler; None if it was handed back or released."""
        limit = self._rate_limit(execution)
        if limit is not None and not self._rate_limited_start(execution, limit):
            return None  # handed back
        if not self.runs.start(execution):
            return None  # released meanwhile
        self._started(execution)
        return execution.run_sync()

    # ------------------------------------------------------------ async handlers

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="venturi-async", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

    async def _run_async(self, execution: Execution) -> None:
        try:
            limit = self._rate_limit(execution)
            if limit is not None:
                limited_start = sync_to_async(self._rate_limited_start, thread_sensitive=True)
                if not await limited_start(execution, limit):
                    return
            if not self.runs.start(execution):
                return
            await self._check_async_connections()
            self._started(execution)
            verdict = await execution.run_async()
            if verdict.error.type:
                self.async_connections_checked = False  # a broken connection fails a run
            self.finish(execution, verdict)
        except BaseException as error:
            self._failed_around(execution, error)
            if isinstance(error, asyncio.CancelledError):
                raise

    def _async_done(self, future: Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            logger.error("an async run ended on an error", exc_info=future.exception())

    async def _check_async_connections(self) -> None:
        """After a lost database or a failed async run: mend the connections of
        `sync_to_async`'s thread, where async handlers' ORM calls run."""
        if self.async_connections_checked:
            return
        self.async_connections_checked = True
        await sync_to_async(close_broken_connections, thread_sensitive=True)()

    @staticmethod
    def _rate_limit(execution: Execution) -> RateLimit | None:
        spec = registry.find(execution.job.kind)  # None for a Django Tasks job
        return None if spec is None else spec.rate_limit

    def _rate_limited_start(self, execution: Execution, limit: RateLimit) -> bool:
        """Just before a rate-limited job's handler: move its recorded start to now, or
        hand it back if it is too late for that (see `rate_starts.py`). False if it must
        not run."""
        job = execution.job
        try:
            in_time = rate_starts.confirm(self.results.alias, job, limit)
        except db.Error as error:  # the run goes on: its claim's record still counts
            logger.warning("job %d: could not record its start time: %s", job.id, error)
            in_time = True
        if not in_time and self.runs.end(execution):
            self.release([execution], reason="started too late to keep its rate limit")
        return in_time

    # ------------------------------------------------------------ verdicts

    def _started(self, execution: Execution) -> None:
        execution.mark_started()
        job = execution.job
        if not self.events.listened(signals.job_started):
            return
        self.events.send(
            signals.job_started,
            job_id=job.id,
            kind=job.kind,
            queue=job.queue,
            attempt=job.attempt,
            worker=self.events.worker,
            trace_context=job.trace_context,
        )

    def finish(self, execution: Execution, verdict: Verdict) -> None:
        """A run's handler returned: queue its verdict, unless the run was ended already."""
        if not self.runs.end(execution):
            self._ended_before(execution, verdict.outcome)
            return
        verdict = verdicts.record_run(
            verdict, duration=_duration(execution), progress=execution.take_progress()
        )
        self._observe_duration(verdict.duration)
        self.results.submit(verdict)
        if self.runs.busy() <= self.wake_at_busy:
            self._wake()

    def _decided(self, verdict: Verdict) -> None:
        """The one verdict of a run: to the results writer (which logs it once written),
        and wake the claimer."""
        self.results.submit(verdict)
        self._wake()

    def _ended_before(self, execution: Execution, outcome: str) -> None:
        """A handler came back after its run was ended (released, or abandoned at its
        timeout): its result is dropped."""
        with self._lock:  # `abandon` ends the run and marks it in one step under this lock
            abandoned = execution.abandoned
        if abandoned:
            self._late_result(execution, outcome)
            return
        logger.warning(
            "job %d: its handler returned %s after the run was released; result discarded",
            execution.job.id,
            outcome,
            extra=self.events.log_extra(execution.job, JournalOutcome.DISCARDED),
        )

    def _failed_around(self, execution: Execution, error: BaseException) -> None:
        """The worker's own code around a handler failed: a retryable failure of the run."""
        logger.error(
            "job %d: the worker failed around its handler: %s",
            execution.job.id,
            error,
            exc_info=error,
            extra=self.events.log_extra(execution.job, JournalOutcome.RETRY),
        )
        if not self.runs.end(execution):
            self._ended_before(execution, JournalOutcome.RETRY)
            return
        try:
            spec = registry.get(execution.job.kind)
        except UnknownKind:
            spec = None
        self._decided(verdicts.retry(execution.job, spec, ErrorInfo.from_exception(error)))

    def _observe_duration(self, seconds: float | None) -> None:
        if seconds is not None:
            mean = self._mean_duration
            self._mean_duration = seconds if mean is None else 0.9 * mean + 0.1 * seconds

    def release(self, executions: list[Execution], *, reason: str) -> None:
        """Hand runs back to the queue, not as failures (their handlers, if any, see
        `should_stop`; their late results are dropped)."""
        for execution in executions:
            execution.lease_lost.set()
            if reason:
                logger.warning(
                    "job %d %s: released",
                    execution.job.id,
                    reason,
                    extra=self.events.log_extra(execution.job, JournalOutcome.RELEASED),
                )
            self.results.submit(verdicts.released(execution.job))

    # ------------------------------------------------------------ timeouts

    def abandon(self, execution: Execution) -> None:
        """A sync handler is past its timeout and grace: end the run, reclaim the slot."""
        with self._lock:
            if not self.runs.end(execution):
                return  # it returned meanwhile
            execution.abandoned = True
            execution.lease_lost.set()
            self._lost_threads += 1
            execution.replaced = self._lost_threads <= self.concurrency
            if not execution.replaced:
                self._unreplaced += 1
                if self._unreplaced == self.concurrency:  # no slot left: nothing will start
                    self.progress.working(HANDLER_POOL)
            lost = self._lost_threads
        spec = registry.get(execution.job.kind)
        verdict = execution.timeout_verdict(spec, grace=f" and its grace of {_grace()}")
        self._decided(verdicts.record_run(verdict, duration=_duration(execution)))
        if execution.replaced:
            self._add_thread()
            logger.warning(
                "job %d: handler thread abandoned past its timeout; a replacement took its "
                "slot (%d lost threads still running)",
                execution.job.id,
                lost,
                extra=self.events.log_extra(execution.job, JournalOutcome.TIMEOUT),
            )
        else:
            logger.error(
                "job %d: handler thread abandoned past its timeout; %d lost threads already, "
                "so no replacement: this worker runs with one slot less until it returns",
                execution.job.id,
                lost,
                extra=self.events.log_extra(execution.job, JournalOutcome.TIMEOUT),
            )

    def _late_result(self, execution: Execution, outcome: str) -> None:
        """An abandoned handler returned at last: drop its result, give its slot back."""
        with self._lock:
            self._lost_threads -= 1
            if not execution.replaced:
                self._unreplaced -= 1
                self.progress.waiting(HANDLER_POOL)  # a slot again
        logger.warning(
            "job %d: the abandoned handler returned %s late; result discarded",
            execution.job.id,
            outcome,
            extra=self.events.log_extra(execution.job, JournalOutcome.DISCARDED),
        )
        self._wake()


def _duration(execution: Execution) -> float | None:
    """How long the run's handler ran (None if it did not start)."""
    return None if execution.started is None else time.monotonic() - execution.started


def _grace() -> timedelta:
    return venturi_settings.TIMEOUT_GRACE
