"""The error triage filters of the job list and the journal: error type, kind, dates.

Each stays fast on a table of millions. The error types offered are read from
the partial index on `Job.error_type` (the jobs whose error is current) by a
loose index scan (one probe per distinct type, never a DISTINCT over the table:
`error_types`); the job list's filter by type walks that index too. Dates are
Django's own date filter (today, past 7 days, this month, this year), and any
range from the URL
(`?finished_at__gte=2026-12-01&finished_at__lt=2026-12-08`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from django_venturi.conf import venturi_settings
from django_venturi.models import Job
from django_venturi.registry import registry
from django_venturi.states import State
from django_venturi.store.error_types import short_name

ERROR_TYPES_LISTED = 100
"""The filter offers at most this many error types (in name order)."""

CURRENT_ERROR = (Q(state=State.FAILED) | Q(state=State.READY, failures__gt=0)) & ~Q(last_error="")
"""Jobs whose last error still describes them: failed, or ready again after a failed run.

A job that completed, was cancelled or is running keeps `last_error` from an earlier
run; the list does not show it as if it were the job's trouble now.
"""
TYPED_CURRENT_ERROR = CURRENT_ERROR & ~Q(error_type="")
"""`CURRENT_ERROR` with a stored type: it implies the condition of the error type index
(`venturi_job_error_type_idx`), so PostgreSQL can read that index for it."""

# PostgreSQL has no skip scan before 18: each step asks the index for the next type
# after the last one found, so the cost is one probe per distinct type.
ERROR_TYPES_SQL = """
-- Each step repeats the index's condition, so that the index serves it.
WITH RECURSIVE found(error_type) AS (
    (SELECT error_type FROM {job} AS job WHERE {current} ORDER BY error_type LIMIT 1)
    UNION ALL
    SELECT (SELECT job.error_type FROM {job} AS job
            WHERE {current} AND job.error_type > found.error_type
            ORDER BY job.error_type LIMIT 1)
    FROM found WHERE found.error_type IS NOT NULL
)
SELECT error_type FROM found WHERE error_type IS NOT NULL LIMIT %s
"""
CURRENT_ERROR_SQL = """job.error_type <> ''
    AND (job.state = 'failed' OR (job.state = 'ready' AND job.failures > 0))"""


def with_selected(names: list[str], selected: str | None) -> list[tuple[str, str]]:
    """A filter's choices, the selected one always among them: Django leaves out a filter
    with no choice, and would list (and "cancel all in this filter" act on) every job."""
    if selected and selected not in names:
        names = sorted([*names, selected])
    return [(name, name) for name in names]


def error_types(using: str | None = None) -> list[str]:
    """The distinct types of the jobs' current errors (`Job.error_type`), in name order."""
    alias = using or venturi_settings.DATABASE
    connection = connections[alias]
    if connection.vendor != "postgresql":
        typed = Job.objects.using(alias).filter(TYPED_CURRENT_ERROR)
        found = typed.order_by("error_type").values_list("error_type", flat=True).distinct()
        return list(found[:ERROR_TYPES_LISTED])
    with connection.cursor() as cursor:
        cursor.execute(
            ERROR_TYPES_SQL.format(
                job=connection.ops.quote_name(Job._meta.db_table), current=CURRENT_ERROR_SQL
            ),
            [ERROR_TYPES_LISTED],
        )
        return [row[0] for row in cursor.fetchall()]


def error_type_choices(selected: str | None) -> list[tuple[str, str]]:
    """(type, shown name) pairs: the short name, with the module where two share one.

    The selected type is always one of them: Django leaves out a filter that offers
    no choice, and "retry all in this filter" must never act on an unfiltered list.
    """
    types = error_types()
    if selected and selected not in types:
        types = sorted([*types, selected])
    names = [short_name(error_type) for error_type in types]
    return [
        (error_type, name if names.count(name) == 1 else error_type)
        for error_type, name in zip(types, names, strict=True)
    ]


class ErrorTypeFilter(admin.SimpleListFilter):
    """Jobs whose current error (`CURRENT_ERROR`) is of one type: what the error column shows."""

    title = "error type"
    parameter_name = "error_type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return error_type_choices(self.value())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(TYPED_CURRENT_ERROR, error_type=value) if value else queryset


class JournalErrorTypeFilter(ErrorTypeFilter):
    """Runs that failed with one error type (the journal's own `error_type`)."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(error_type=value) if value else queryset


class JournalKindFilter(admin.SimpleListFilter):
    """The runs of one task kind; kinds from the registry, as on the job list."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return with_selected(sorted(registry.kinds()), self.value())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(job__kind=self.value()) if self.value() else queryset


class EnqueuedFilter(admin.DateFieldListFilter):
    """Django's date filter on `enqueued_at`, titled as the list's column."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = "enqueued"


class FinishedFilter(admin.DateFieldListFilter):
    """Django's date filter on `finished_at` (its "No date" is a job not finished)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = "finished"
