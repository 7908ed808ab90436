"""Django signals sent by workers (receivers run in worker threads; errors are logged)."""

from __future__ import annotations

from django.dispatch import Signal

job_started = Signal()
"""A handler is about to run. Keyword arguments: `job_id`, `kind`, `queue`,
`attempt`, `worker`, `trace_context` (the W3C headers stored at enqueue, a dict
with `traceparent` and maybe `tracestate`, or None: see `tracing.py`). Sent from
the handler's thread (sync handlers) or the event loop's thread (async handlers),
with `sender` = `Worker`."""

job_finished = Signal()
"""A run's outcome was written. Keyword arguments: `job_id`, `kind`, `queue`,
`attempt`, `worker`, `outcome` (a `JournalOutcome` value: `discarded` when the
worker had lost the job), `duration` (seconds the handler ran, or None for a
job released before it started), `error_type` ('' when none). Sent from the
worker's results writer after the write, with `sender` = `Worker`."""
