"""The error triage filters of the job list and the journal: error type, kind, dates.

Each stays fast on a table of millions. The error types offered are read from
the partial index on `Job.error_type` by a loose index scan (one probe per
distinct type, never a DISTINCT over the table: `error_types`); the job list's
filter by type walks that index too. Dates are Django's own date filter
(today, past 7 days, this month, this year), and any range from the URL
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

# PostgreSQL has no skip scan before 18: each step asks the index for the next type
# after the last one found, so the cost is one probe per distinct type.
ERROR_TYPES_SQL = """
WITH RECURSIVE found(error_type) AS (
    (SELECT error_type FROM {job} WHERE error_type <> '' ORDER BY error_type LIMIT 1)
    UNION ALL
    SELECT (SELECT job.error_type FROM {job} AS job
            WHERE job.error_type <> '' AND job.error_type > found.error_type
            ORDER BY job.error_type LIMIT 1)
    FROM found WHERE found.error_type IS NOT NULL
)
SELECT error_type FROM found WHERE error_type IS NOT NULL LIMIT %s
"""


def error_types(using: str | None = None) -> list[str]:
    """The distinct error types jobs hold (`Job.error_type`), in name order."""
    alias = using or venturi_settings.DATABASE
    connection = connections[alias]
    if connection.vendor != "postgresql":
        typed = Job.objects.using(alias).exclude(error_type="")
        found = typed.order_by("error_type").values_list("error_type", flat=True).distinct()
        return list(found[:ERROR_TYPES_LISTED])
    with connection.cursor() as cursor:
        cursor.execute(
            ERROR_TYPES_SQL.format(job=connection.ops.quote_name(Job._meta.db_table)),
            [ERROR_TYPES_LISTED],
        )
        return [row[0] for row in cursor.fetchall()]


def error_type_choices() -> list[tuple[str, str]]:
    """(type, shown name) pairs: the short name, with the module where two share one."""
    types = error_types()
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
        return error_type_choices()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(CURRENT_ERROR, error_type=value) if value else queryset


class JournalErrorTypeFilter(admin.SimpleListFilter):
    """Runs that failed with one error type (the journal's own `error_type`)."""

    title = "error type"
    parameter_name = "error_type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return error_type_choices()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(error_type=value) if value else queryset


class JournalKindFilter(admin.SimpleListFilter):
    """The runs of one task kind; kinds from the registry, as on the job list."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in sorted(registry.kinds())]

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
