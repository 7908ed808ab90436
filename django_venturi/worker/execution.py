"""Running one claimed job's handler and judging what it returned."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from django_venturi.context import Context, Flag
from django_venturi.payloads import stored
from django_venturi.payloads.codec import PayloadError
from django_venturi.registry import TaskSpec, UnknownKind, registry
from django_venturi.states import JournalOutcome
from django_venturi.store import verdicts
from django_venturi.store.atomic import run_atomically
from django_venturi.store.claim import ClaimedJob
from django_venturi.store.verdicts import ErrorInfo, Verdict
from django_venturi.tasks_backend import runner


class Execution:
    """One run of one claimed job: its task, its context, and its stop signals."""

    def __init__(
        self,
        job: ClaimedJob,
        *,
        database: str,
        stop: threading.Event,
        heartbeat: Callable[[Execution], bool],
        worker: str = "",
        claimed: float | None = None,
    ) -> None:
        self.job = job
        """The claimed job; from its handler's start, `started_at` is that start."""
        self.claimed = time.monotonic() if claimed is None else claimed
        """`time.monotonic()` when the job was claimed (the time of `job.started_at`)."""
        self.worker = worker
        """The name of the worker running it."""
        self.database = database
        self.lease_lost = Flag()
        self.cancel_requested = Flag()
        """Set when `venturi.cancel()` asked for this job while it runs."""
        self.timed_out = Flag()
        """Set when the run passed its task's timeout."""
        self.started: float | None = None
        """`time.monotonic()` when the handler started."""
        self.abandoned = False
        """The worker gave up waiting (timeout past the grace): its late result is dropped."""
        self.replaced = False
        """When abandoned: a replacement handler thread took over this one's slot."""
        self._database = database
        self._stop = stop
        self._heartbeat = heartbeat
        self._progress_lock = threading.Lock()
        self._progress: dict[str, Any] | None = None
        self._progress_dirty = False

    def mark_started(self) -> None:
        """The handler starts now: record it, and date the run from here, not the claim.

        The claim's database time plus the monotonic time the job waited in the
        buffer, so the journal keeps one clock (the database's) and no statement
        is added.
        """
        self.started = time.monotonic()
        self.job.start_after(max(0.0, self.started - self.claimed))

    # ------------------------------------------------------------ progress

    def record_progress(self, progress: dict[str, Any]) -> None:
        """Keep the latest `ctx.progress()`; the results writer writes it (throttled)."""
        with self._progress_lock:
            self._progress = progress
            self._progress_dirty = True

    def take_progress(self) -> tuple[bool, dict[str, Any] | None]:
        """The progress not written yet, if any (and mark it written)."""
        with self._progress_lock:
            dirty, self._progress_dirty = self._progress_dirty, False
            return dirty, self._progress

    # ------------------------------------------------------------ running

    @property
    def is_async(self) -> bool:
        """Whether the handler is an `async def` (run on the worker's event loop)."""
        if runner.is_tasks_job(self.job):
            return runner.is_async(self)
        try:
            return registry.get(self.job.kind).is_async
        except UnknownKind:
            return False  # prepare() turns it into a permanent failure

    def prepare(self) -> tuple[TaskSpec, Any, Context] | Verdict:
        """Decode the row into its task; a row that does not fit is a permanent failure."""
        try:
            spec = registry.get(self.job.kind)
        except UnknownKind as error:
            return verdicts.failed(self.job, ErrorInfo.from_exception(error))
        decoding = "payload"
        try:
            instance = spec.decode(self.job.payload)
            decoding = "carry"
            carry = spec.decode_carry(self.job.carry)
        except PayloadError as error:
            info = ErrorInfo.from_exception(error)
            message = f"the stored payload does not fit {spec.origin}: {info.message}"
            return verdicts.failed(self.job, ErrorInfo(info.type, message, info.traceback))
        except RecursionError as error:  # readable, but too deep to decode into its types
            return unreadable_verdict(self.job, decoding, stored.unreadable(error))
        context = Context(
            job_id=self.job.id,
            attempt=self.job.attempt,
            carry=carry,
            enqueued_at=self.job.enqueued_at,
            database=self._database,
            stop=self._stop,
            lease_lost=self.lease_lost,
            heartbeat=lambda: self._heartbeat(self),
            cancel_requested=self.cancel_requested,
            timed_out=self.timed_out,
            on_progress=self.record_progress,
        )
        return spec, instance, context

    def run_sync(self) -> Verdict:
        """Run a sync handler in the calling thread."""
        unreadable = unreadable_row(self.job)
        if unreadable is not None:
            return self._judged(unreadable)
        if runner.is_tasks_job(self.job):
            return runner.run_sync(self)
        prepared = self.prepare()
        if isinstance(prepared, Verdict):
            return self._judged(prepared)
        spec, instance, context = prepared
        try:
            if spec.atomic:
                return self._run_atomically(spec, instance, context)
            result = instance.handle(context)
        except BaseException as error:
            # The handler boundary: even SystemExit from a handler must become a
            # verdict, or its thread would die and the job stay held forever.
            # Raised after the timeout asked it to stop: the journal says `timeout`.
            outcome = JournalOutcome.TIMEOUT if self.timed_out.is_set() else JournalOutcome.RETRY
            return self._judged(verdicts.from_exception(self.job, spec, error, outcome=outcome))
        return self._judged(verdicts.from_outcome(self.job, spec, result))

    def _run_atomically(self, spec: TaskSpec, instance: Any, context: Context) -> Verdict:
        """The handler and its verdict in one transaction (see `atomic.py`)."""
        return run_atomically(
            self._database,
            self.worker,
            lambda: instance.handle(context),
            lambda result: self._judged(verdicts.from_outcome(self.job, spec, result)),
        )

    async def run_async(self) -> Verdict:
        """Run an `async def` handler on the calling event loop, cancelled at its timeout."""
        unreadable = unreadable_row(self.job)
        if unreadable is not None:
            return self._judged(unreadable)
        if runner.is_tasks_job(self.job):
            return await runner.run_async(self)
        prepared = self.prepare()
        if isinstance(prepared, Verdict):
            return self._judged(prepared)
        spec, instance, context = prepared
        limit = spec.timeout.total_seconds() if spec.timeout is not None else None
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                result = await instance.handle(context)
        except BaseException as error:  # the handler boundary, as in run_sync
            if deadline.expired():
                self.timed_out.set()
                return self._judged(self.timeout_verdict(spec, grace=""))
            return self._judged(verdicts.from_exception(self.job, spec, error))
        if deadline.expired():  # the handler swallowed its cancellation
            self.timed_out.set()
            return self._judged(self.timeout_verdict(spec, grace=""))
        return self._judged(verdicts.from_outcome(self.job, spec, result))

    def timeout_verdict(self, spec: TaskSpec | None, *, grace: str) -> Verdict:
        assert spec is not None and spec.timeout is not None
        return self._judged(verdicts.timed_out(self.job, spec, spec.timeout, grace))

    def _judged(self, verdict: Verdict) -> Verdict:
        """A cancel request overrides whatever the run produced."""
        if self.cancel_requested.is_set() and verdict.outcome is not JournalOutcome.CANCELLED:
            return verdicts.cancelled(self.job)
        return verdict


def unreadable_row(job: ClaimedJob) -> Verdict | None:
    """A permanent failure if the row's payload or carry is one Python cannot read.

    Before anything else looks at them (a Django Tasks job's envelope too): such a
    row fails alone and for good, since running it again would read the same bytes.
    """
    for name, value in (("payload", job.payload), ("carry", job.carry)):
        if isinstance(value, stored.Unreadable):
            return unreadable_verdict(job, name, value)
    return None


def unreadable_verdict(job: ClaimedJob, name: str, value: stored.Unreadable) -> Verdict:
    """`stored payload unreadable: ...`, naming the carry when it is the carry."""
    where = "" if name == "payload" else f"{name}: "
    message = f"{stored.UNREADABLE_PREFIX}{where}{value.reason}"
    return verdicts.failed(job, ErrorInfo.from_reason(message, type=UNREADABLE_ERROR_TYPE))


UNREADABLE_ERROR_TYPE = "django_venturi.UnreadablePayload"
"""The journal's error type of a job failed on a stored value Python cannot read."""
