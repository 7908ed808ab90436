"""The worker: claims due jobs, runs their handlers, writes what happened.

Threads of one worker process, each with its own database connection:

- the main thread claims jobs into free handler slots and recovers expired leases;
- handler threads run sync handlers (one job at a time each); one event-loop
  thread runs `async def` handlers;
- the completer thread writes verdicts in batches (group commit) and extends
  the leases of running jobs every heartbeat interval;
- on PostgreSQL, a listener thread waits on LISTEN and wakes the main thread.

The management command `venturi_worker` only parses flags and builds a `Worker`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from types import FrameType
from typing import Any

from asgiref.sync import sync_to_async
from django import db
from django.db import connections
from django.dispatch import Signal

from django_venturi import (
    backend_runner,
    leases,
    progress,
    registration,
    signals,
    telemetry,
    verdicts,
)
from django_venturi.cancel import cancel_channel
from django_venturi.claim import (
    ClaimedJob,
    ClaimRequest,
    KindLimit,
    claim,
    seconds_until_next_due,
)
from django_venturi.completion import write_verdicts
from django_venturi.conf import as_timedelta, venturi_settings
from django_venturi.execution import Execution
from django_venturi.listener import Listener
from django_venturi.periodic import Scheduler
from django_venturi.reconnect import DATABASE_ERRORS, close_broken_connections, reachable
from django_venturi.registry import registry
from django_venturi.scheduling import TierClock
from django_venturi.states import JournalOutcome
from django_venturi.sweeper import Sweeper
from django_venturi.timeouts import Watchdog
from django_venturi.verdicts import Verdict

logger = logging.getLogger("django_venturi.worker")

"""Errors that mean the database went away: wait, reconnect, carry on."""
RECONNECT_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
COMPLETER_BATCH = 500
PREFETCH_FACTOR = 2
"""A worker holds up to this many times `concurrency` jobs: the rest wait in a local
buffer, so handler threads never wait for a claim round trip."""
BUFFER_HORIZON = 0.05
"""Short jobs are claimed further ahead: up to `batch_size` more, as long as the
buffered jobs wait no more than about this many seconds for a handler slot
(judged by the recent mean handler duration). Fewer, larger claims per job."""


class Worker:
    """A worker process's whole life: `run()` until stopped, or until idle with `burst`."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        shutdown_timeout: timedelta | float | None = None,
        poll_interval: timedelta | float | None = None,
        burst: bool = False,
        database: str | None = None,
        batch_size: int | None = None,
        name: str | None = None,
        kind_concurrency: dict[str, int] | None = None,
    ) -> None:
        self.queues = list(queues) if queues else None
        self.kind_concurrency = dict(kind_concurrency or {})
        """Per-worker caps: at most N jobs of a kind at once in this process."""
        self.concurrency = concurrency or venturi_settings.CONCURRENCY
        self.shutdown_timeout = as_timedelta(
            venturi_settings.SHUTDOWN_TIMEOUT if shutdown_timeout is None else shutdown_timeout
        ).total_seconds()
        self.poll_interval = as_timedelta(
            venturi_settings.POLL_INTERVAL if poll_interval is None else poll_interval
        ).total_seconds()
        self.burst = burst
        self.database = database or venturi_settings.DATABASE
        self.batch_size = batch_size or venturi_settings.BATCH_SIZE
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.heartbeat_interval = self._heartbeat_interval()
        self.rescue_interval = venturi_settings.RESCUE_INTERVAL.total_seconds()
        self.tasks_kind_prefix = backend_runner.claimable_prefix()
        """Also run Django Tasks jobs (when TASKS names venturi's backend), else None."""

        self._stop = threading.Event()
        """Set at the first stop request: claim nothing more; handlers see should_stop."""
        self._force = threading.Event()
        """Set at the second stop request: skip the wait for running handlers."""
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._queued: dict[int, Execution] = {}
        """Claimed, waiting for a handler thread."""
        self._executing: dict[int, Execution] = {}
        """Handler running."""
        self._held: dict[int, Execution] = {}
        """Every job this worker holds the claim of, until its verdict is written."""
        self._verdicts: queue.SimpleQueue[Verdict | None] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[Execution | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: Listener | None = None
        self._clock = TierClock(venturi_settings.PRIORITY_WEIGHTS)
        self._database_down_since: float | None = None
        self._mean_duration: float | None = None
        """Moving average of handler durations, in seconds (sizes the local buffer)."""
        self.processed = 0
        self._async_connections_checked = True
        """False after a lost database or a failed async run, until `sync_to_async`'s
        thread has closed its broken connections."""
        self._lost_threads = 0
        """Handler threads abandoned past their timeout that have not returned yet."""
        self._unreplaced = 0
        """Of those, how many no replacement thread took over (each is a slot less)."""

    # ------------------------------------------------------------ public

    @staticmethod
    def _heartbeat_interval() -> float:
        """The setting, or a third of the shortest lease of a known task if that is shorter."""
        shortest = min(
            (spec.lease for spec in registry.specs() if spec.lease is not None),
            default=venturi_settings.DEFAULT_LEASE,
        )
        return min(venturi_settings.HEARTBEAT_INTERVAL, shortest / 3).total_seconds()

    def run(self) -> None:
        """Work until `stop()` (or a signal), or with `burst`, until nothing is due."""
        logger.info(
            "worker %s starting: queues=%s concurrency=%d kinds=%d",
            self.name,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            len(registry.kinds()),
            extra={"worker": self.name},
        )
        # A configuration error stops the worker here, before it registers: a worker
        # that never ran must not be listed as live.
        telemetry.install(database=self.database)
        self._start_threads()
        self._guarded(self._register)
        try:
            Sweeper.start_if_configured(alias=self.database, stop=self._stop)
            self._claim_loop()
        finally:
            self._shut_down()

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop: finish running jobs, then release what is left.

        Safe to call from any thread or a signal handler. A second call (or
        `force=True`) skips the wait for running handlers.
        """
        if self._stop.is_set() or force:
            self._force.set()
        self._stop.set()
        self._wake.set()

    def install_signal_handlers(self) -> Callable[[], None]:
        """Make SIGTERM and SIGINT call `stop()`; return a function restoring the old handlers."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous: dict[int, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            logger.info(
                "worker %s got %s: %s",
                self.name,
                signal.Signals(signum).name,
                "forcing" if self._stop.is_set() else "stopping",
                extra={"worker": self.name},
            )
            self.stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)

        def restore() -> None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

        return restore

    # ------------------------------------------------------------ claiming

    def _claim_loop(self) -> None:
        next_rescue = 0.0
        scheduler = None if self.burst else Scheduler(self.database)
        next_periodic = 0.0 if scheduler is not None else float("inf")
        while not self._stop.is_set():
            self._wake.clear()
            if time.monotonic() >= next_rescue:
                self._guarded(lambda: leases.recover_expired(self.database, self.name))
                next_rescue = time.monotonic() + self.rescue_interval
            if scheduler is not None and time.monotonic() >= next_periodic:
                self._guarded(scheduler.run_pass)  # periodic ticks that came due
                next_periodic = time.monotonic() + scheduler.interval
            capacity = self._capacity()
            free = self._free(capacity)
            # Claim in batches of at least `concurrency` (at least half the local
            # buffer), not one claim per finished job.
            threshold = max(self.concurrency, capacity // 2)
            claimed = self._guarded(partial(self._claim, free)) if free >= threshold else None
            if claimed and len(claimed) < free:
                continue  # slots left: claim again at once (a capped kind may have held back)
            if self.burst and not claimed and self._idle():
                if self._confirm_nothing_due():
                    return
                continue
            # Nothing due: sleep until the next poll or scheduled job. Otherwise all
            # slots are busy, and a finishing job wakes the loop.
            wait = self._idle_wait() if claimed == [] else self.poll_interval
            # Never sleep past the next recovery sweep or scheduler pass, however long
            # the poll interval.
            next_chore = min(next_rescue, next_periodic)
            self._wake.wait(min(wait, max(0.0, next_chore - time.monotonic())))

    def _claim_request(self, free: int) -> ClaimRequest:
        kinds = registry.kinds()
        return ClaimRequest(
            worker=self.name,
            limit=min(free, self.batch_size),
            kinds=kinds,
            leases=[registry.get(kind).lease or venturi_settings.DEFAULT_LEASE for kind in kinds],
            queues=self.queues,
            limits=self._kind_limits(kinds),
            kind_prefix=self.tasks_kind_prefix,
            prefix_lease=venturi_settings.DEFAULT_LEASE,
        )

    def _kind_limits(self, kinds: Sequence[str]) -> list[KindLimit]:
        with self._lock:
            held = Counter(execution.job.kind for execution in self._held.values())
        limits = []
        for kind in kinds:
            global_cap = registry.get(kind).concurrency
            local_cap = self.kind_concurrency.get(kind)
            if global_cap is not None or local_cap is not None:
                local_room = None if local_cap is None else local_cap - held[kind]
                limits.append(KindLimit(kind, global_cap=global_cap, local_room=local_room))
        return limits

    def _idle_wait(self) -> float:
        """Sleep until the next poll, or until a job scheduled sooner than that is due."""
        until_due: float | None = self._guarded(
            lambda: seconds_until_next_due(self.database, self._claim_request(1))
        )
        if until_due is None:
            return self.poll_interval
        return min(self.poll_interval, max(until_due, 0.005))

    def _claim(self, free: int) -> list[ClaimedJob]:
        jobs = claim(self.database, self._claim_request(free), self._clock)
        claimed = time.monotonic()
        for job in jobs:
            self._dispatch(job, claimed)
        return jobs

    def _dispatch(self, job: ClaimedJob, claimed: float) -> None:
        execution = Execution(
            job,
            database=self.database,
            stop=self._stop,
            heartbeat=self._heartbeat_one,
            worker=self.name,
            claimed=claimed,
        )
        with self._lock:
            self._queued[job.id] = execution
            self._held[job.id] = execution
        if execution.is_async:
            loop = self._event_loop()
            asyncio.run_coroutine_threadsafe(self._run_async(execution), loop)
        else:
            self._work.put(execution)

    def _capacity(self) -> int:
        """Jobs held at once: a handler slot each, plus those buffered, claimed ahead.

        At least as many buffered as slots; for short jobs up to `batch_size`, so
        long as the buffer holds no more than BUFFER_HORIZON seconds of work.
        """
        with self._lock:
            slots = self.concurrency - self._unreplaced  # less threads lost to timeouts
        ahead = slots * (PREFETCH_FACTOR - 1)
        mean = self._mean_duration
        if mean is not None:
            within_horizon = int(slots * BUFFER_HORIZON / max(mean, 1e-6))
            ahead = max(ahead, min(self.batch_size, within_horizon))
        return slots + ahead

    def _free(self, capacity: int) -> int:
        """Room to claim into: the buffer's, less what the completer has fallen behind by.

        Verdicts waiting to be written beyond one completer batch hold claims
        back, so a slow database never lets held jobs (and memory) pile up.
        """
        with self._lock:
            busy = len(self._queued) + len(self._executing)
            unwritten = len(self._held) - busy
        return capacity - busy - max(0, unwritten - COMPLETER_BATCH)

    def _busy(self) -> int:
        with self._lock:
            return len(self._queued) + len(self._executing)

    def _idle(self) -> bool:
        with self._lock:
            return not self._held

    def _confirm_nothing_due(self) -> bool:
        """In burst mode: after the last verdicts are written, is anything due?"""
        free = self._capacity() - self._busy()
        claimed = self._guarded(lambda: self._claim(free))
        return claimed is not None and not claimed and self._idle()

    # ------------------------------------------------------------ running

    def _start(self, execution: Execution) -> bool:
        """Move a queued execution to executing; False if it was released meanwhile."""
        with self._lock:
            if self._queued.pop(execution.job.id, None) is None:
                return False
            self._executing[execution.job.id] = execution
            return True

    def _started(self, execution: Execution) -> None:
        execution.mark_started()
        job = execution.job
        self._send(
            signals.job_started,
            job_id=job.id,
            kind=job.kind,
            queue=job.queue,
            attempt=job.attempt,
            worker=self.name,
        )

    def _finish(self, execution: Execution, verdict: Verdict) -> None:
        if execution.abandoned:
            self._late_result(execution, verdict)
            return
        dirty, last_progress = execution.take_progress()
        if dirty:
            verdict = dataclasses.replace(verdict, set_progress=True, progress=last_progress)
        if execution.started is not None:
            verdict = dataclasses.replace(verdict, duration=time.monotonic() - execution.started)
            self._observe_duration(verdict.duration)
        # Queue the verdict and leave `_executing` in one step: a shutdown that sees
        # no job executing any more then queues its end marker after this verdict,
        # so the completer writes it before it exits.
        with self._lock:
            self._verdicts.put(verdict)
            self._executing.pop(execution.job.id, None)
        self._log_verdict(verdict)
        self._wake.set()

    def _observe_duration(self, seconds: float | None) -> None:
        if seconds is not None:
            mean = self._mean_duration
            self._mean_duration = seconds if mean is None else 0.9 * mean + 0.1 * seconds

    def _handler_thread(self) -> None:
        while True:
            execution = self._work.get()
            if execution is None:
                break
            if not self._start(execution):
                continue
            self._started(execution)
            db.close_old_connections()
            try:
                verdict = execution.run_sync()
            finally:
                db.close_old_connections()
            self._finish(execution, verdict)
            if execution.abandoned and execution.replaced:
                break  # a replacement thread holds this slot now
        connections.close_all()

    async def _run_async(self, execution: Execution) -> None:
        if not self._start(execution):
            return
        await self._check_async_connections()
        self._started(execution)
        verdict = await execution.run_async()
        if verdict.error.type:
            self._async_connections_checked = False  # a broken connection fails a run
        self._finish(execution, verdict)

    async def _check_async_connections(self) -> None:
        """After a lost database or a failed async run: mend the connections of
        `sync_to_async`'s thread, where async handlers' ORM calls run."""
        if self._async_connections_checked:
            return
        self._async_connections_checked = True
        await sync_to_async(close_broken_connections, thread_sensitive=True)()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="venturi-async", daemon=True)
            thread.start()
            self._loop = loop
        return self._loop

    def _heartbeat_one(self, execution: Execution) -> bool:
        """`ctx.heartbeat()`: extend one job's lease from the handler's own thread."""
        try:
            held = leases.extend(self.database, [execution.job])
        except DATABASE_ERRORS:
            db.close_old_connections()
            return not execution.lease_lost.is_set()
        if execution.job.id not in held:
            execution.lease_lost.set()
        return execution.job.id in held

    # ------------------------------------------------------------ completing

    def _completer_thread(self) -> None:
        pending: list[Verdict] = []
        closing = False
        next_heartbeat = time.monotonic() + self.heartbeat_interval
        next_progress = time.monotonic() + progress.PROGRESS_INTERVAL
        while pending or not closing:
            if time.monotonic() >= next_progress:
                next_progress = self._flush_progress()
            if not pending:
                wake_at = min(next_heartbeat, next_progress)
                try:
                    first = self._verdicts.get(timeout=max(0.0, wake_at - time.monotonic()))
                except queue.Empty:
                    if time.monotonic() >= next_heartbeat:
                        next_heartbeat = self._heartbeat_all()
                    continue
                if first is None:
                    closing = True
                    continue
                pending.append(first)
            closing = self._drain_verdicts(pending) or closing
            if self._write(pending):
                pending = []
            elif closing and self._force.is_set():
                logger.error(
                    "worker %s exits without writing %d verdicts: their leases will expire "
                    "and other workers will run those jobs again",
                    self.name,
                    len(pending),
                    extra={"worker": self.name},
                )
                pending = []
            else:
                time.sleep(self._reconnect_delay())
            if time.monotonic() >= next_heartbeat:
                next_heartbeat = self._heartbeat_all()
        connections.close_all()

    def _drain_verdicts(self, pending: list[Verdict]) -> bool:
        """Take whatever verdicts are waiting; True if the end marker was among them."""
        while len(pending) < COMPLETER_BATCH:
            try:
                verdict = self._verdicts.get_nowait()
            except queue.Empty:
                return False
            if verdict is None:
                return True
            pending.append(verdict)
        return False

    def _write(self, pending: list[Verdict]) -> bool:
        try:
            applied = write_verdicts(self.database, self.name, pending)
        except DATABASE_ERRORS as error:
            self._database_lost(error)
            return False
        self._database_back()
        for verdict in pending:
            self._send(
                signals.job_finished,
                job_id=verdict.job.id,
                kind=verdict.job.kind,
                queue=verdict.job.queue,
                attempt=verdict.job.attempt,
                worker=self.name,
                outcome=verdict.outcome if verdict.job.id in applied else JournalOutcome.DISCARDED,
                duration=verdict.duration,
                error_type=verdict.error.type,
            )
        for verdict in pending:
            if verdict.after_write is not None:
                self._after_write(verdict, verdict.job.id in applied)
        with self._lock:
            for verdict in pending:
                self._held.pop(verdict.job.id, None)
            self.processed += len(pending)
        self._wake.set()
        return True

    def _after_write(self, verdict: Verdict, applied: bool) -> None:
        """Run a verdict's follow-up (Django Tasks' `task_finished`); log, never raise."""
        assert verdict.after_write is not None
        try:
            verdict.after_write(applied)
        except Exception:
            logger.exception(
                "follow-up of job %d failed",
                verdict.job.id,
                extra=self._extra(verdict.job, verdict.outcome),
            )

    def _heartbeat_all(self) -> float:
        with self._lock:
            running = list(self._held.values())
        if running:
            try:
                held = leases.extend(self.database, [execution.job for execution in running])
            except DATABASE_ERRORS as error:
                self._database_lost(error)
                return time.monotonic() + min(self.heartbeat_interval, 1.0)
            for execution in running:
                if execution.job.id not in held:
                    execution.lease_lost.set()
            self._guarded_cancel_check(running)
        self._beat(len(running))
        return time.monotonic() + self.heartbeat_interval

    def _register(self) -> None:
        registration.register(
            self.database, name=self.name, queues=self.queues, concurrency=self.concurrency
        )

    def _beat(self, running: int) -> None:
        """Refresh this worker's registry row (re-created if it was pruned meanwhile)."""
        try:
            if not registration.beat(
                self.database, name=self.name, running=running, processed=self.processed
            ):
                self._register()
        except DATABASE_ERRORS as error:
            self._database_lost(error)

    # ------------------------------------------------------------ shutting down

    def _shut_down(self) -> None:
        self._stop.set()
        self._release_queued()
        deadline = time.monotonic() + self.shutdown_timeout
        while self._busy() and time.monotonic() < deadline and not self._force.is_set():
            time.sleep(0.02)
        self._release_executing()
        self._verdicts.put(None)
        for _ in self._handler_threads:
            self._work.put(None)
        self._completer.join()
        self._guarded(
            lambda: registration.stopped(self.database, name=self.name, processed=self.processed)
        )
        if self._listener is not None:
            self._listener.stop()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        connections.close_all()
        logger.info(
            "worker %s stopped after %d jobs",
            self.name,
            self.processed,
            extra={"worker": self.name},
        )

    def _release_queued(self) -> None:
        """Jobs claimed but not started go back to the queue at once."""
        with self._lock:
            waiting = list(self._queued.values())
            self._queued.clear()
        for execution in waiting:
            self._verdicts.put(verdicts.released(execution.job))

    def _release_executing(self) -> None:
        """Handlers still running past the timeout: hand their jobs back, not as failures."""
        with self._lock:
            running = list(self._executing.values())
            self._executing.clear()
        for execution in running:
            execution.lease_lost.set()
            logger.warning(
                "job %d still running at shutdown: released",
                execution.job.id,
                extra=self._extra(execution.job, JournalOutcome.RELEASED),
            )
            self._verdicts.put(verdicts.released(execution.job))

    # ------------------------------------------------------------ cancel, timeout, progress

    def _on_cancel_notify(self, payload: str | None) -> None:
        """A cancel NOTIFY (job ids), or None after the listener (re)connected."""
        if payload is None:
            return  # missed requests are found by the next heartbeat
        asked = {int(part) for part in payload.split(",") if part.strip().isdigit()}
        with self._lock:
            hit = [self._held[job_id] for job_id in asked if job_id in self._held]
        for execution in hit:
            self._cancel_requested(execution, "notification")

    def _guarded_cancel_check(self, running: list[Execution]) -> None:
        """At each heartbeat: the cancel requests of held jobs (all that SQLite has)."""
        try:
            asked = leases.cancel_requests(self.database, [e.job for e in running])
        except DATABASE_ERRORS as error:
            self._database_lost(error)
            return
        for execution in running:
            if execution.job.id in asked:
                self._cancel_requested(execution, "heartbeat")

    def _cancel_requested(self, execution: Execution, source: str) -> None:
        if execution.cancel_requested.is_set():
            return
        execution.cancel_requested.set()
        logger.info(
            "job %d: cancel requested (learnt by %s); the handler sees should_stop",
            execution.job.id,
            source,
            extra=self._extra(execution.job, JournalOutcome.CANCELLED),
        )

    def _flush_progress(self) -> float:
        """Write the progress that changed since the last flush (completer thread)."""
        with self._lock:
            held = list(self._held.values())
        updates = []
        for execution in held:
            dirty, value = execution.take_progress()
            if dirty:
                updates.append((execution.job, value))
        try:
            progress.write_progress(self.database, updates)
        except DATABASE_ERRORS as error:
            self._database_lost(error)
        return time.monotonic() + progress.PROGRESS_INTERVAL

    def _executing_now(self) -> list[Execution]:
        with self._lock:
            return list(self._executing.values())

    def _abandon(self, execution: Execution) -> None:
        """A sync handler is past its timeout and grace: end the run, reclaim the slot."""
        with self._lock:
            if self._executing.pop(execution.job.id, None) is None:
                return  # it returned meanwhile
            execution.abandoned = True
            execution.lease_lost.set()
            self._lost_threads += 1
            execution.replaced = self._lost_threads <= self.concurrency
            if not execution.replaced:
                self._unreplaced += 1
            spec = registry.get(execution.job.kind)
            verdict = execution.timeout_verdict(spec, grace=f" and its grace of {self._grace()}")
            if execution.started is not None:
                verdict = dataclasses.replace(
                    verdict, duration=time.monotonic() - execution.started
                )
            self._verdicts.put(verdict)
        self._log_verdict(verdict)
        if execution.replaced:
            thread = threading.Thread(
                target=self._handler_thread,
                name=f"venturi-handler-{len(self._handler_threads)}",
                daemon=True,
            )
            self._handler_threads.append(thread)
            thread.start()
            logger.warning(
                "job %d: handler thread abandoned past its timeout; a replacement took its "
                "slot (%d lost threads still running)",
                execution.job.id,
                self._lost_threads,
                extra=self._extra(execution.job, JournalOutcome.TIMEOUT),
            )
        else:
            logger.error(
                "job %d: handler thread abandoned past its timeout; %d lost threads already, "
                "so no replacement: this worker runs with one slot less until it returns",
                execution.job.id,
                self._lost_threads,
                extra=self._extra(execution.job, JournalOutcome.TIMEOUT),
            )
        self._wake.set()

    def _late_result(self, execution: Execution, verdict: Verdict) -> None:
        """An abandoned handler returned at last: drop its result, give its slot back."""
        with self._lock:
            self._lost_threads -= 1
            if not execution.replaced:
                self._unreplaced -= 1
        logger.warning(
            "job %d: the abandoned handler returned %s late; result discarded",
            execution.job.id,
            verdict.outcome,
            extra=self._extra(execution.job, JournalOutcome.DISCARDED),
        )
        self._wake.set()

    @staticmethod
    def _grace() -> timedelta:
        return venturi_settings.TIMEOUT_GRACE

    # ------------------------------------------------------------ plumbing

    def _start_threads(self) -> None:
        self._handler_threads = [
            threading.Thread(target=self._handler_thread, name=f"venturi-handler-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        self._completer = threading.Thread(
            target=self._completer_thread, name="venturi-completer", daemon=True
        )
        for thread in [*self._handler_threads, self._completer]:
            thread.start()
        self._watchdog = Watchdog(
            executing=self._executing_now, abandon=self._abandon, stopped=self._force
        )
        self._watchdog.start()
        # LISTEN_DATABASE belongs to VENTURI["DATABASE"]; a worker given another
        # alias listens on that alias itself.
        listen_alias = (
            venturi_settings.LISTEN_DATABASE
            if self.database == venturi_settings.DATABASE
            else self.database
        )
        if connections[listen_alias].vendor == "postgresql":
            self._listener = Listener(
                alias=listen_alias,
                channels={
                    venturi_settings.NOTIFY_CHANNEL: lambda payload: self._wake.set(),
                    cancel_channel(): self._on_cancel_notify,
                },
            )
            self._listener.start()

    def _guarded(self, action: Callable[[], Any]) -> Any:
        """Run a database action of the main thread; on a lost database, wait and return None."""
        try:
            result = action()
        except DATABASE_ERRORS as error:
            self._database_lost(error)
            self._stop.wait(self._reconnect_delay())
            return None
        self._database_back()
        return result

    def _database_lost(self, error: Exception) -> None:
        db.close_old_connections()
        close_broken_connections()
        self._async_connections_checked = False
        with self._lock:
            first = self._database_down_since is None
            if first:
                self._database_down_since = time.monotonic()
        if first:
            logger.error(
                "worker %s lost the database (%s); retrying until it is back",
                self.name,
                error,
                extra={"worker": self.name},
            )

    def _database_back(self) -> None:
        """After an action succeeded: if the database was lost, is it back? Say so once.

        An action may succeed without a round trip (a scheduler pass with no
        schedules, a claim with every kind at its cap), so while the database is
        down, success alone proves nothing: this thread's connection must work.
        """
        with self._lock:
            if self._database_down_since is None:
                return
        if not reachable(self.database):
            return
        with self._lock:
            since, self._database_down_since = self._database_down_since, None
        if since is not None:
            logger.warning(
                "worker %s reconnected after %.1f s",
                self.name,
                time.monotonic() - since,
                extra={"worker": self.name},
            )

    def _reconnect_delay(self) -> float:
        with self._lock:
            since = self._database_down_since
        down_for = 0.0 if since is None else time.monotonic() - since
        for delay in RECONNECT_DELAYS:
            if down_for < delay * 4:
                return delay
        return RECONNECT_DELAYS[-1]

    def _send(self, signal: Signal, **arguments: Any) -> None:
        """Send a signal; a failing receiver is logged, never allowed to stop the worker."""
        if not signal.has_listeners(Worker):
            return
        for receiver, result in signal.send_robust(Worker, **arguments):
            if isinstance(result, Exception):
                logger.error(
                    "signal receiver %r failed for job %s: %s",
                    receiver,
                    arguments.get("job_id"),
                    result,
                    exc_info=result,
                    extra={"worker": self.name, "job_id": arguments.get("job_id")},
                )

    def _log_verdict(self, verdict: Verdict) -> None:
        job = verdict.job
        problem = bool(verdict.error.type) and verdict.outcome != JournalOutcome.PAUSED
        if not problem:
            level = logging.INFO
        elif verdict.outcome == JournalOutcome.FAILED:
            level = logging.ERROR
        else:
            level = logging.WARNING
        if not logger.isEnabledFor(level):
            return  # the hot path at -v 0: no record, no extra dict
        extra = self._extra(job, verdict.outcome)
        extra["duration"] = verdict.duration
        if problem:
            logger.log(
                level,
                "job %d (%s) attempt %d: %s: %s",
                job.id,
                job.kind,
                job.attempt,
                verdict.outcome,
                verdict.error.summary(),
                extra=extra,
            )
        else:
            logger.info(
                "job %d (%s) attempt %d: %s",
                job.id,
                job.kind,
                job.attempt,
                verdict.outcome,
                extra=extra,
            )

    def _extra(self, job: ClaimedJob, outcome: str) -> dict[str, Any]:
        return {
            "worker": self.name,
            "job_id": job.id,
            "kind": job.kind,
            "queue": job.queue,
            "attempt": job.attempt,
            "outcome": str(outcome),
        }
