"""What the job list needs to stay fast on a table of millions of jobs.

An estimated count past `EXACT_COUNT_LIMIT` (`EstimatedCountPaginator`, from the
planner's `planner_rows`), filters whose choices come from the registry and the
model (no DISTINCT over the table), the "current error" rule the last error
column and filter share (`CURRENT_ERROR`, `has_current_error`), the text search
(`search_jobs`, never into secret fields) and the time-in-state column
(`state_age`). The journal's list uses the paginator and the parameter check too.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property
from django.utils.text import smart_split, unescape_string_literal

from django_venturi.admin import masking
from django_venturi.admin.display import short_age
from django_venturi.admin.filters import CURRENT_ERROR, with_selected
from django_venturi.conf import venturi_settings
from django_venturi.models import Job
from django_venturi.payloads import text
from django_venturi.registry import registry
from django_venturi.states import State

EXACT_COUNT_LIMIT = 10_000
"""Results up to this size are counted exactly; past it the planner's estimate is shown."""

BIGINT_MAX = 2**63 - 1
"""The largest id a job can have (PostgreSQL's bigint): a larger number is no job's id."""

Listed = TypeVar("Listed", bound=Model)


def refuse_unstorable_parameters(request: HttpRequest) -> None:
    """A filter or search holding a NUL character would make PostgreSQL fail the page.

    Raise Django's `IncorrectLookupParameters` instead: the admin then shows the
    list without parameters, as it does for any lookup it cannot apply.
    """
    for key, values in request.GET.lists():
        if any(text.problem(value) for value in [key, *values]):
            raise IncorrectLookupParameters("a parameter holds a character the database refuses")


def checked_changelist(request: HttpRequest, build: Callable[[HttpRequest], Any]) -> Any:
    """`build(request)`, a model admin's change list, after `refuse_unstorable_parameters`.

    When the list cannot use its parameters (`?priority__exact=²`, a page past the
    last, a NUL), Django shows it without them and says nothing: a message names them.
    """
    try:
        refuse_unstorable_parameters(request)
        return build(request)
    except IncorrectLookupParameters:
        if ERROR_FLAG not in request.GET:  # else Django shows its own error page
            named = ", ".join(
                f"{key}={reprlib.repr(value)}"
                for key, value in request.GET.items()
                if key != ERROR_FLAG
            )
            messages.warning(
                request,
                f"The list cannot use {named}: it is shown without them.",
                fail_silently=True,
            )
        raise


def typed_job_id(typed: str) -> int | None:
    """A job id as a user types it: ASCII digits up to `BIGINT_MAX`; None for anything else.

    `str.isdigit()` also accepts "²" (which `int()` refuses) and "٣" (which it reads
    as 3), and `int()` refuses more than 4,300 digits: none of them may reach a query.
    """
    if not (typed.isascii() and typed.isdigit()) or len(typed) > len(str(BIGINT_MAX)):
        return None
    number = int(typed)
    return number if number <= BIGINT_MAX else None


def job_id_search(
    request: HttpRequest, queryset: QuerySet[Listed], search_term: str, field: str
) -> QuerySet[Listed] | None:
    """The rows whose `field` is the job id a search names ("123" or "#123"), or None when
    the search is text (unicode digits such as "²" are text).

    A number past `BIGINT_MAX` is no job's id: a message says so and nothing is found,
    without a query that would overflow.
    """
    term = search_term.strip().removeprefix("#")
    if not (term.isascii() and term.isdigit()):
        return None
    job_id = typed_job_id(term)
    if job_id is None:
        messages.warning(
            request,
            f"A job id is at most {BIGINT_MAX}: no job has id {reprlib.repr(term)}.",
            fail_silently=True,
        )
        return queryset.none()
    return queryset.filter(**{field: job_id})


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Count exactly up to `EXACT_COUNT_LIMIT` rows, then take PostgreSQL's estimate.

    `count(*)` over millions of rows is a full scan on every page load; the
    estimate comes from `EXPLAIN`, which reads the table statistics
    (`pg_class.reltuples` scaled to the table's current size) in under a millisecond.
    """

    estimated = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        bounded = queryset.order_by()[: EXACT_COUNT_LIMIT + 1].count()
        if bounded <= EXACT_COUNT_LIMIT or connections[queryset.db].vendor != "postgresql":
            return bounded if bounded <= EXACT_COUNT_LIMIT else queryset.count()
        self.estimated = True
        return max(planner_rows(queryset), bounded)


def planner_rows(queryset: QuerySet[Any]) -> int:
    """PostgreSQL's estimate of how many rows a queryset returns (no rows are read)."""
    sql, params = queryset.order_by().query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        row = cursor.fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return int(plan[0]["Plan"]["Plan Rows"])


class KindFilter(admin.SimpleListFilter):
    """Kinds from the registry: no DISTINCT over the whole table to list them."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return with_selected(sorted(registry.kinds()), self.value())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(kind=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    """Queues named by registered tasks and the default queue."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        queues = {venturi_settings.DEFAULT_QUEUE}
        queues.update(spec.queue for spec in registry.specs() if spec.queue)
        return with_selected(sorted(queues), self.value())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


def has_current_error(job: Job) -> bool:
    """`CURRENT_ERROR` for one row."""
    if not job.last_error:
        return False
    return job.state == State.FAILED or (job.state == State.READY and job.failures > 0)


class HasErrorFilter(admin.SimpleListFilter):
    """Jobs with a current error (`CURRENT_ERROR`): the ones the last error column shows."""

    title = "last error"
    parameter_name = "has_error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(CURRENT_ERROR)
        if self.value() == "no":
            return queryset.exclude(CURRENT_ERROR)
        return queryset


def search_jobs(queryset: QuerySet[Job], search_term: str) -> QuerySet[Job]:
    """Jobs whose kind, dedup key or payload holds every word of the search.

    The payload is searched only for kinds that cannot hold a `venturi.secret()`
    field (`masking.searchable`): the job page masks those, and a search would
    reveal them a prefix at a time.
    """
    payload_searchable = masking.searchable()
    for word in search_words(search_term):
        queryset = queryset.filter(
            Q(kind__icontains=word)
            | Q(dedup_key__icontains=word)
            | (Q(payload__icontains=word) & payload_searchable)
        )
    return queryset


def search_words(search_term: str) -> list[str]:
    """The words of a search, as Django's admin splits them ("quoted words" are one)."""
    words = []
    for word in smart_split(search_term):
        if word[:1] in "\"'" and word[-1:] == word[:1]:
            word = unescape_string_literal(word)
        words.append(word)
    return words


def state_age(job: Job, now: datetime) -> str:
    """A ready job's age since it became due, a running job's time in `running`,
    how long ago a finished job finished."""
    if job.state == State.READY:
        if job.run_at > now:
            return f"due in {short_age(job.run_at - now)}"
        return f"waiting {short_age(now - job.run_at)}"
    if job.state == State.RUNNING and job.started_at is not None:
        return f"running {short_age(now - job.started_at)}"
    if job.state == State.WAITING:
        dependencies = "dependency" if job.waiting_for == 1 else "dependencies"
        return f"for {job.waiting_for} {dependencies}"
    return f"{short_age(now - job.finished_at)} ago" if job.finished_at else ""
