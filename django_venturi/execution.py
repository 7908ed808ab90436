"""Running one claimed job's handler and judging what it returned."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django_venturi import verdicts
from django_venturi.claim import ClaimedJob
from django_venturi.codec import PayloadError
from django_venturi.context import Context
from django_venturi.registry import TaskSpec, UnknownKind, registry
from django_venturi.verdicts import ErrorInfo, Verdict


class Execution:
    """One run of one claimed job: its task, its context, and its stop signals."""

    def __init__(
        self,
        job: ClaimedJob,
        *,
        database: str,
        stop: threading.Event,
        heartbeat: Callable[[Execution], bool],
    ) -> None:
        self.job = job
        self.lease_lost = threading.Event()
        self.started: float | None = None
        """`time.monotonic()` when the handler started."""
        self._database = database
        self._stop = stop
        self._heartbeat = heartbeat

    def prepare(self) -> tuple[TaskSpec, Any, Context] | Verdict:
        """Decode the row into its task; a row that does not fit is a permanent failure."""
        try:
            spec = registry.get(self.job.kind)
        except UnknownKind as error:
            return verdicts.failed(self.job, ErrorInfo.from_exception(error))
        try:
            instance = spec.decode(self.job.payload)
            carry = spec.decode_carry(self.job.carry)
        except PayloadError as error:
            info = ErrorInfo.from_exception(error)
            message = f"the stored payload does not fit {spec.origin}: {info.message}"
            return verdicts.failed(self.job, ErrorInfo(info.type, message, info.traceback))
        context = Context(
            job_id=self.job.id,
            attempt=self.job.attempt,
            carry=carry,
            enqueued_at=self.job.enqueued_at,
            database=self._database,
            stop=self._stop,
            lease_lost=self.lease_lost,
            heartbeat=lambda: self._heartbeat(self),
        )
        return spec, instance, context

    def run_sync(self) -> Verdict:
        """Run a sync handler in the calling thread."""
        prepared = self.prepare()
        if isinstance(prepared, Verdict):
            return prepared
        spec, instance, context = prepared
        try:
            result = instance.handle(context)
        except BaseException as error:
            # The handler boundary: even SystemExit from a handler must become a
            # verdict, or its thread would die and the job stay held forever.
            return verdicts.from_exception(self.job, spec, error)
        return verdicts.from_outcome(self.job, spec, result)

    async def run_async(self) -> Verdict:
        """Run an `async def` handler on the calling event loop."""
        prepared = self.prepare()
        if isinstance(prepared, Verdict):
            return prepared
        spec, instance, context = prepared
        try:
            result = await instance.handle(context)
        except BaseException as error:  # the handler boundary, as in run_sync
            return verdicts.from_exception(self.job, spec, error)
        return verdicts.from_outcome(self.job, spec, result)
