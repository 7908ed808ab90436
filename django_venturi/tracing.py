"""The W3C trace context a job keeps from the code that enqueued it.

With `VENTURI["METRICS"]` on, an enqueue inside a recording span (a request the
application traces, say) stores that span's context with the job, as the W3C
Trace Context headers would carry it: `{"traceparent": "00-<trace id>-<span
id>-<flags>"}`, plus `"tracestate"` when the span has one. Each run's span links
to it (`observe/telemetry.py`): the run is a trace of its own, linked to the
request's, not a child of it. The job page shows the trace id, a link when
`VENTURI["TRACE_URL"]` is set.

Nothing here imports OpenTelemetry when `METRICS` is off: `current()` reads one
setting and returns. Reading a stored context back (`trace_id`, `trace_url`)
never needs OpenTelemetry, so the admin shows it on any host.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django_venturi.conf import venturi_settings

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_ID_FIELD = "trace_id"
"""The one placeholder `TRACE_URL` takes."""

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_NO_TRACE = "0" * 32
_UNSET: Any = object()
_held: ContextVar[dict[str, str] | None] = ContextVar("venturi_trace_context", default=_UNSET)


def current() -> dict[str, str] | None:
    """The W3C headers of the current span, to store with a job; None without one.

    None when `METRICS` is off (without importing OpenTelemetry), when
    OpenTelemetry is not installed, or when no valid span is current. Inside
    `held(...)`, what that was given instead.
    """
    if not venturi_settings.METRICS:
        return None
    held_context = _held.get()
    if held_context is not _UNSET:
        return held_context
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:  # venturi.E037 says so
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    # The W3C propagator itself, not the global one: a project that propagates B3
    # or Jaeger headers still gets the context stored in one known form.
    TraceContextTextMapPropagator().inject(carrier)
    return {key: carrier[key] for key in (TRACEPARENT, TRACESTATE) if carrier.get(key)} or None


@contextmanager
def held(context: dict[str, str] | None) -> Iterator[None]:
    """Enqueue with `context` (from an earlier `current()`) as the enqueuing span's.

    `enqueue_on_commit` enqueues when the transaction commits, maybe after the span
    that asked for it ended: the job keeps the span current at the ask.
    """
    token = _held.set(context)
    try:
        yield
    finally:
        _held.reset(token)


def trace_id(stored: Any) -> str | None:
    """The trace id (32 hex digits) of a stored context; None if it holds none.

    Reads the `traceparent` as the W3C format has it, and refuses anything else
    (the column can be written by SQL): what comes out is safe in a URL.
    """
    if not isinstance(stored, dict):
        return None
    traceparent = stored.get(TRACEPARENT)
    if not isinstance(traceparent, str):
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None or match[1] == "ff" or match[2] == _NO_TRACE:
        return None
    return match[2]


def trace_url(trace: str) -> str | None:
    """Where `VENTURI["TRACE_URL"]` shows trace `trace`; None without the setting."""
    template = venturi_settings.TRACE_URL
    if template is None or trace_url_problem(template) is not None:  # venturi.E038
        return None
    return template.format(trace_id=trace)


def trace_url_problem(value: Any) -> str | None:
    """What is wrong with a `TRACE_URL` setting, or None if it is usable.

    It must be None or a string whose only placeholders are `{trace_id}`, at
    least one: `str.format` would raise on any other at the first job page.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        return f"must be None or a string with {{{TRACE_ID_FIELD}}}, got {value!r}"
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(value) if field is not None]
    except ValueError as error:  # a lone brace
        return f"is not a format string ({error}), got {value!r}"
    others = sorted({field for field in fields if field != TRACE_ID_FIELD})
    if others:
        named = ", ".join("{" + field + "}" for field in others)
        return f"may hold no placeholder but {{{TRACE_ID_FIELD}}} (found {named}), got {value!r}"
    if not fields:
        return f"must hold {{{TRACE_ID_FIELD}}} where the trace id goes, got {value!r}"
    try:
        value.format(trace_id=_NO_TRACE)
    except ValueError as error:  # a bad conversion or format spec: {trace_id!x}
        return f"is not a format string ({error}), got {value!r}"
    return None
