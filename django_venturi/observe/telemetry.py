"""OpenTelemetry metrics and spans, with the `metrics` extra and `VENTURI["METRICS"] = True`.

What a worker records (names follow OpenTelemetry's dotted style):

- `venturi.job.runs` (counter): finished runs, by `venturi.kind`, `venturi.queue`
  and `venturi.outcome`;
- `venturi.job.duration` (histogram, seconds): how long handlers ran, same attributes;
- `venturi.jobs.ready`, `venturi.jobs.due`, `venturi.jobs.waiting`,
  `venturi.jobs.running` (observable gauges): live jobs per queue (`due`: the ready
  ones whose time has come, the depth to scale workers on);
- `venturi.queue.latency` (observable gauge, seconds): how long the oldest due job
  of each queue has waited;
- one span per execution, `venturi.job <kind>`, from the handler's start to the
  written outcome; a failed or lost run ends with an error status. It links to the
  span that enqueued the job, when its context was stored (`tracing.py`).

The worker calls `install()` at start; it connects receivers to `job_started` and
`job_finished`. Nothing here imports OpenTelemetry unless metrics are enabled and
the package is installed, so projects without the extra pay nothing.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from typing import TYPE_CHECKING, Any

from django_venturi import signals, tracing
from django_venturi.conf import venturi_settings
from django_venturi.states import JournalOutcome

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Link, Span, TracerProvider

    from django_venturi.observe.snapshot import Stats

INSTRUMENTATION = "django_venturi"
SNAPSHOT_MAX_AGE = 5.0
"""Seconds one `venturi.stats()` snapshot serves the gauges (one query set, not one each)."""
FAILED_OUTCOMES = {
    JournalOutcome.RETRY,
    JournalOutcome.FAILED,
    JournalOutcome.LEASE_EXPIRED,
    JournalOutcome.TIMEOUT,
}

PER_QUEUE_GAUGES = (
    ("venturi.jobs.ready", "ready", "Ready jobs per queue (due or scheduled)."),
    ("venturi.jobs.waiting", "waiting", "Jobs per queue waiting for their dependencies."),
    ("venturi.jobs.running", "running", "Running jobs per queue."),
)
"""The gauges of live jobs per queue in one state: (name, state, description)."""

_installed: Telemetry | None = None
_install_lock = threading.Lock()


def available() -> bool:
    """True when the OpenTelemetry API is importable (without importing it)."""
    return importlib.util.find_spec("opentelemetry") is not None


def install(
    *,
    database: str | None = None,
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Telemetry | None:
    """Start recording if `METRICS` is on and OpenTelemetry is installed; idempotent.

    Providers default to the global ones the application configured; tests pass their own.
    """
    global _installed
    if not venturi_settings.METRICS:
        return None
    if not available():
        raise RuntimeError(
            'VENTURI["METRICS"] is True but OpenTelemetry is not installed: '
            "pip install 'django-venturi[metrics]' (and an SDK and exporter of your choice)"
        )
    with _install_lock:
        if _installed is None:
            _installed = Telemetry(
                database=database or venturi_settings.DATABASE,
                meter_provider=meter_provider,
                tracer_provider=tracer_provider,
            )
            _installed.connect()
        return _installed


def uninstall() -> None:
    """Stop recording (tests)."""
    global _installed
    with _install_lock:
        if _installed is not None:
            _installed.disconnect()
            _installed = None


class Telemetry:
    """The instruments, and the receivers that feed them from the worker's signals."""

    def __init__(
        self,
        *,
        database: str,
        meter_provider: MeterProvider | None,
        tracer_provider: TracerProvider | None,
    ) -> None:
        from opentelemetry import metrics, trace

        self.database = database
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(INSTRUMENTATION)
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(INSTRUMENTATION)
        self.runs = meter.create_counter(
            "venturi.job.runs", unit="{run}", description="Finished runs of jobs, by outcome."
        )
        self.duration = meter.create_histogram(
            "venturi.job.duration", unit="s", description="How long handlers ran."
        )
        for name, state, description in PER_QUEUE_GAUGES:
            meter.create_observable_gauge(
                name, callbacks=[self._observing(state)], unit="{job}", description=description
            )
        meter.create_observable_gauge(
            "venturi.jobs.due",
            callbacks=[self._observe_due],
            unit="{job}",
            description="Ready jobs per queue whose time has come: the backlog to work off.",
        )
        meter.create_observable_gauge(
            "venturi.queue.latency",
            callbacks=[self._observe_latency],
            unit="s",
            description="How long the oldest due job of each queue has waited.",
        )
        self._spans: dict[tuple[int, int], Span] = {}
        self._lock = threading.Lock()
        self._snapshot: tuple[float, Stats] | None = None

    # ------------------------------------------------------------ signals

    def connect(self) -> None:
        signals.job_started.connect(self.on_started, dispatch_uid=INSTRUMENTATION)
        signals.job_finished.connect(self.on_finished, dispatch_uid=INSTRUMENTATION)

    def disconnect(self) -> None:
        signals.job_started.disconnect(dispatch_uid=INSTRUMENTATION)
        signals.job_finished.disconnect(dispatch_uid=INSTRUMENTATION)

    def on_started(
        self,
        sender: Any,
        *,
        job_id: int,
        kind: str,
        queue: str,
        attempt: int,
        worker: str,
        trace_context: Any = None,
        **kwargs: Any,
    ) -> None:
        span = self.tracer.start_span(
            f"venturi.job {kind}",
            attributes={
                "venturi.job_id": job_id,
                "venturi.kind": kind,
                "venturi.queue": queue,
                "venturi.attempt": attempt,
                "venturi.worker": worker,
            },
            links=enqueue_links(trace_context),
        )
        with self._lock:
            self._spans[(job_id, attempt)] = span

    def on_finished(
        self,
        sender: Any,
        *,
        job_id: int,
        kind: str,
        queue: str,
        attempt: int,
        outcome: str,
        duration: float | None,
        error_type: str,
        **kwargs: Any,
    ) -> None:
        from opentelemetry.trace import Status, StatusCode

        attributes = {"venturi.kind": kind, "venturi.queue": queue, "venturi.outcome": str(outcome)}
        self.runs.add(1, attributes)
        if duration is not None:
            self.duration.record(duration, attributes)
        with self._lock:
            span = self._spans.pop((job_id, attempt), None)
        if span is None:
            return  # released before its handler started: no span was opened
        span.set_attribute("venturi.outcome", str(outcome))
        if error_type:
            span.set_attribute("error.type", error_type)
        if outcome in FAILED_OUTCOMES or outcome == JournalOutcome.DISCARDED:
            span.set_status(Status(StatusCode.ERROR, f"{outcome}: {error_type}".rstrip(": ")))
        span.end()

    # ------------------------------------------------------------ gauges

    def _stats(self) -> Stats:
        from django_venturi.observe.snapshot import stats

        now = time.monotonic()
        with self._lock:
            if self._snapshot is not None and now - self._snapshot[0] < SNAPSHOT_MAX_AGE:
                return self._snapshot[1]
        snapshot = stats(using=self.database)
        with self._lock:
            self._snapshot = (now, snapshot)
        return snapshot

    def _per_queue(self, state: str) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        totals: dict[str, int] = {}
        for (live_state, _, queue), jobs in self._stats().live.items():
            if live_state == state:
                totals[queue] = totals.get(queue, 0) + jobs
        return [Observation(jobs, {"venturi.queue": queue}) for queue, jobs in totals.items()]

    def _observing(self, state: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """The callback of the gauge of live jobs in `state` (`PER_QUEUE_GAUGES`)."""
        return lambda options: self._per_queue(state)

    def _observe_due(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        snapshot = self._stats()
        # 0 for a queue with live jobs but none due, rather than no point at all.
        queues = {queue for (_, _, queue) in snapshot.live} | set(snapshot.due)
        return [
            Observation(snapshot.due.get(queue, 0), {"venturi.queue": queue})
            for queue in sorted(queues)
        ]

    def _observe_latency(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [
            Observation(age.total_seconds(), {"venturi.queue": queue})
            for queue, age in self._stats().oldest_due_age.items()
        ]


def enqueue_links(stored: Any) -> list[Link]:
    """A link to the span that enqueued a job, from its stored context (none without one).

    A link, not a parent: the run is a trace of its own, which may start long after
    the request that enqueued it ended, and runs again on a retry.
    """
    if tracing.trace_id(stored) is None:
        return []
    from opentelemetry import trace
    from opentelemetry.trace import Link
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract(stored)
    span_context = trace.get_current_span(context).get_span_context()
    if not span_context.is_valid:
        return []
    return [Link(span_context, attributes={"venturi.link": "enqueued"})]
