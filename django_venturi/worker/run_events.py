"""What a worker tells about its runs: log records and Django signals.

Neither may ever stop a worker: a failing signal receiver is logged, and at
`-v 0` a run that went well costs no log record at all.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from django_venturi.payloads import masking
from django_venturi.registry import registry
from django_venturi.states import JournalOutcome
from django_venturi.store.claim import ClaimedJob
from django_venturi.store.verdicts import Verdict

logger = logging.getLogger("django_venturi.worker")


class RunEvents:
    """The log records and signals of one worker's runs."""

    def __init__(self, worker: str, *, sender: type) -> None:
        self.worker = worker
        self.sender = sender
        """What signals name as their sender (the `Worker` class)."""

    def log_extra(self, job: ClaimedJob, outcome: str) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "job_id": job.id,
            "kind": job.kind,
            "queue": job.queue,
            "attempt": job.attempt,
            "outcome": str(outcome),
        }

    def listened(self, signal: Signal) -> bool:
        """Whether anything receives `signal` from this worker: callers on the per-run
        path ask first and build no arguments for nothing."""
        # `has_listeners` alone takes a lock and walks the receivers on every call.
        return bool(signal.receivers) and signal.has_listeners(self.sender)

    def send(self, signal: Signal, **arguments: Any) -> None:
        """Send a signal; a failing receiver is logged, never allowed to stop the worker."""
        if not self.listened(signal):
            return
        for receiver, result in signal.send_robust(self.sender, **arguments):
            if isinstance(result, Exception):
                logger.error(
                    "signal receiver %r failed for job %s: %s",
                    receiver,
                    arguments.get("job_id"),
                    result,
                    exc_info=result,
                    extra={"worker": self.worker, "job_id": arguments.get("job_id")},
                )

    def verdict(self, verdict: Verdict) -> None:
        """One record per finished run: INFO if it went well, else WARNING or ERROR."""
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
        extra = self.log_extra(job, verdict.outcome)
        extra["duration"] = verdict.duration
        if problem:
            message = "job %d (%s) attempt %d: %s: %s"
            args: tuple[Any, ...] = (
                job.id,
                job.kind,
                job.attempt,
                verdict.outcome,
                without_secrets(job, verdict.error.summary()),
            )
        else:
            message = "job %d (%s) attempt %d: %s"
            args = (job.id, job.kind, job.attempt, verdict.outcome)
        # Made and handed to the handlers directly: `logger.info` would first walk
        # the stack to find its caller, a sixth of what a record costs, for a place
        # that is always this one.
        logger.handle(
            logger.makeRecord(
                logger.name, level, __file__, _LINE, message, args, None, "verdict", extra
            )
        )


_LINE = RunEvents.verdict.__code__.co_firstlineno
"""The line the per-run records name as theirs (`lineno`)."""


def without_secrets(job: ClaimedJob, text: str) -> str:
    """`text` with the values of the job's `venturi.secret()` fields hidden: a handler's
    exception may quote one (`payloads.masking`; the admin hides them the same way)."""
    types = registry.declared_types(job.kind)
    if types is None:  # no handler ran: nothing of the payload is in the text
        return text
    return masking.redact_text(text, masking.stored_secret_texts(types, job.payload, job.carry))
