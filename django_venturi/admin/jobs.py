"""The Django admin as the queue's dashboard: browse jobs, act on them, watch the queue.

- The job list stays fast on a table of millions: filters whose choices come from
  the registry and the model (no DISTINCT over the table), no related rows per
  line, and an estimated count once the result passes `EXACT_COUNT_LIMIT`.
- A job's page shows its payload (secret fields masked) and carry as indented
  JSON, the states it went through, and its journal with folded tracebacks.
- Actions, each behind its own permission and a confirmation page: retry now
  (`retry_job`), cancel (`cancel_job`), delete (Django's delete permission), and
  a cleanup page for old finished jobs (`cleanup_jobs`).
- A stats page (view permission) draws `venturi.stats()`: live counts, queue
  latency, the last hour per minute as an SVG chart, and the live workers.

Fields are never editable here: jobs change only through these actions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Field, Q, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import smart_split, unescape_string_literal

from django_venturi.admin import pauses as pause_admin
from django_venturi.conf import as_age, venturi_settings
from django_venturi.models import Job, JournalEntry
from django_venturi.observe.snapshot import Stats, stats
from django_venturi.payloads import codec, text
from django_venturi.registry import registry
from django_venturi.states import FINISHED_STATES, LIVE_STATES, JournalOutcome, State
from django_venturi.store import registration, tallies
from django_venturi.store.cancel import cancel
from django_venturi.store.retention import cleanup, delete_jobs
from django_venturi.store.retry import retry_now
from django_venturi.store.verdicts import GAVE_UP_SEPARATOR, OUTCOME_TYPE_PREFIX, ErrorInfo

if TYPE_CHECKING:
    JobAdminBase = admin.ModelAdmin[Job]
    JournalEntryAdminBase = admin.ModelAdmin[JournalEntry]
    JournalInlineBase = admin.TabularInline[JournalEntry, Job]
else:
    JobAdminBase = JournalEntryAdminBase = admin.ModelAdmin
    JournalInlineBase = admin.TabularInline

EXACT_COUNT_LIMIT = 10_000
"""Results up to this size are counted exactly; past it the planner's estimate is shown."""
CONFIRM_LISTED = 100
"""A confirmation page names at most this many of the selected jobs."""
CHART_BAR_WIDTH = 10
CHART_HEIGHT = 120


# ---------------------------------------------------------------- the job list


def refuse_unstorable_parameters(request: HttpRequest) -> None:
    """A filter or search holding a NUL character would make PostgreSQL fail the page.

    Raise Django's `IncorrectLookupParameters` instead: the admin then shows the
    list without parameters, as it does for any lookup it cannot apply.
    """
    for key, values in request.GET.lists():
        if any(text.problem(value) for value in [key, *values]):
            raise IncorrectLookupParameters("a parameter holds a character the database refuses")


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
        return [(kind, kind) for kind in sorted(registry.kinds())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(kind=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    """Queues named by registered tasks and the default queue."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        queues = {venturi_settings.DEFAULT_QUEUE}
        queues.update(spec.queue for spec in registry.specs() if spec.queue)
        return [(queue, queue) for queue in sorted(queues)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


CURRENT_ERROR = (Q(state=State.FAILED) | Q(state=State.READY, failures__gt=0)) & ~Q(last_error="")
"""Jobs whose last error still describes them: failed, or ready again after a failed run.

A job that completed, was cancelled or is running keeps `last_error` from an earlier
run; the list does not show it as if it were the job's trouble now.
"""


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


def compact_time(moment: datetime | None) -> str:
    """`2026-05-04 13:07:59` in the current time zone: sortable by eye, one line wide."""
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def date_over_time(moment: datetime | None) -> SafeString | str:
    """`compact_time` on two lines, date over time: half as wide, for a list's column."""
    date, _, time = compact_time(moment).partition(" ")
    return format_html("{}<br>{}", date, time) if time else "-"


def model_field(model: type[Job] | type[JournalEntry], name: str) -> Field[Any, Any]:
    """A concrete field of the model (not a relation's reverse side)."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field), name
    return field


def to_the_second(model: type[Job] | type[JournalEntry], field: str) -> Callable[[Any, Any], str]:
    """A read-only admin column showing a datetime field to the second (`compact_time`).

    Django shows datetimes in `DATETIME_FORMAT`, "Dec. 3, 2026, 9 a.m.", without
    the seconds (or even the minutes) that a job's times are about.
    """

    @admin.display(description=model_field(model, field).verbose_name, ordering=field)
    def show(model_admin: Any, obj: Any) -> str:
        return compact_time(getattr(obj, field)) or "-"

    show.__name__ = f"{field}_text"
    return show


def help_texts(model: type[Job], fields: Sequence[str]) -> dict[str, str]:
    """The model's help texts, for the `to_the_second` columns of those fields."""
    found = {name: str(model_field(model, name).help_text) for name in fields}
    return {f"{name}_text": text for name, text in found.items() if text}


def short_age(delta: timedelta) -> str:
    """`42s`, `5m 03s`, `2h 10m`, `3d 4h`: readable at a glance in a narrow column."""
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def search_jobs(queryset: QuerySet[Job], search_term: str) -> QuerySet[Job]:
    """Jobs whose kind, dedup key or payload holds every word of the search.

    The payload is searched only for kinds without `venturi.secret()` fields: the
    job page masks those, and a search would reveal them a prefix at a time.
    """
    secret_kinds = [spec.kind for spec in registry.specs() if codec.holds_secrets(spec.cls)]
    payload_searchable = ~Q(kind__in=secret_kinds) if secret_kinds else Q()
    for word in smart_split(search_term):
        if word[:1] in "\"'" and word[-1:] == word[:1]:
            word = unescape_string_literal(word)
        queryset = queryset.filter(
            Q(kind__icontains=word)
            | Q(dedup_key__icontains=word)
            | (Q(payload__icontains=word) & payload_searchable)
        )
    return queryset


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


WORKFLOW_LINKS_SHOWN = 50
"""Dependencies or dependents listed on a job page; the rest are counted."""


def workflow_links(jobs: QuerySet[Job]) -> SafeString | str:
    """Links to jobs of a workflow, each with its state, in id order."""
    shown = list(jobs.order_by("id").only("id", "kind", "state")[: WORKFLOW_LINKS_SHOWN + 1])
    if not shown:
        return "-"
    links = format_html_join(
        "<br>",
        '<a href="{}">#{} {}</a> <span class="venturi-state venturi-{}">{}</span>',
        (
            (
                reverse("admin:django_venturi_job_change", args=[quote(job.pk)]),
                job.pk,
                job.kind,
                job.state,
                job.state,
            )
            for job in shown[:WORKFLOW_LINKS_SHOWN]
        ),
    )
    if len(shown) <= WORKFLOW_LINKS_SHOWN:
        return links
    more = jobs.count() - WORKFLOW_LINKS_SHOWN
    return format_html("{}<br>and {} more", links, more)


# ---------------------------------------------------------------- the job page


class JournalInline(JournalInlineBase):
    model = JournalEntry
    extra = 0
    can_delete = False
    fields = ("attempt", "outcome", "worker", "started_at_text", "duration", "error")
    readonly_fields = fields
    ordering = ("id",)
    verbose_name_plural = "journal (one entry per run)"

    started_at_text = to_the_second(JournalEntry, "started_at")

    @admin.display(description="duration")
    def duration(self, entry: JournalEntry) -> str:
        return run_duration(entry)

    @admin.display(description="error")
    def error(self, entry: JournalEntry) -> SafeString | str:
        if not entry.error_type:
            return "-"
        summary = f"{entry.error_type}: {entry.error_message}"
        if not entry.traceback:
            return summary
        return format_html(
            '<details class="venturi-traceback"><summary>{}</summary><pre>{}</pre></details>',
            summary,
            entry.traceback,
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[JournalEntry]:
        return super().get_queryset(request).using(venturi_settings.DATABASE)

    def has_add_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False


def run_duration(entry: JournalEntry) -> str:
    """`0.125 s`: the handler's run, from its start to the verdict."""
    if entry.started_at is None or entry.finished_at is None:
        return "-"
    return f"{(entry.finished_at - entry.started_at).total_seconds():.3f} s"


OUTCOME_LEADS_TO = {
    JournalOutcome.COMPLETED: State.COMPLETED,
    JournalOutcome.FAILED: State.FAILED,
    JournalOutcome.CANCELLED: State.CANCELLED,
    JournalOutcome.RETRY: State.READY,
    JournalOutcome.PAUSED: State.READY,
    JournalOutcome.RELEASED: State.READY,
    JournalOutcome.TIMEOUT: State.READY,
    JournalOutcome.LEASE_EXPIRED: State.READY,
}
"""The usual next state after a run's outcome (a last retry, timeout or lost lease can
end `failed` instead: the job's current state on the last line says which)."""


def state_history(job: Job, entries: Sequence[JournalEntry]) -> list[tuple[datetime | None, str]]:
    """The states a job went through, from its enqueue time and its journal."""
    events: list[tuple[datetime | None, str]] = [(job.enqueued_at, "enqueued: ready")]
    for entry in entries:
        if entry.outcome == JournalOutcome.DISCARDED:
            continue
        worker = f" by {entry.worker}" if entry.worker else ""
        events.append((entry.started_at, f"attempt {entry.attempt}{worker}: running"))
        next_state = OUTCOME_LEADS_TO.get(JournalOutcome(entry.outcome))
        events.append(
            (entry.finished_at, f"{entry.get_outcome_display()}: {next_state or job.state}")
        )
    if job.state == State.RUNNING:
        events.append((job.started_at, f"attempt {job.attempt} by {job.claimed_by}: running"))
    elif job.state == State.CANCELLED and (not entries or entries[-1].outcome != "cancelled"):
        events.append((job.finished_at, "cancelled"))
    elif job.state == State.READY and events[-1][1].endswith(": failed"):
        events.append((None, "retried from the admin: ready"))
    return events


# ---------------------------------------------------------------- retry and cancel


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """An action that asks first: the list action's name, its job-page button's URL, its page."""

    name: str
    button: str
    title: str
    explanation: str


RETRY = Confirmation(
    name="retry_now",
    button="retry",
    title="Retry these jobs now?",
    explanation=(
        "Ready and failed jobs become ready with run_at = now. A failed job starts a fresh "
        "set of attempts (its failure count goes back to 0; give_up_after still counts "
        "from the first enqueue). Other jobs are left as they are."
    ),
)
CANCEL = Confirmation(
    name="cancel_jobs",
    button="cancel",
    title="Cancel these jobs?",
    explanation=(
        "Ready jobs become cancelled at once. Running jobs are asked to stop: their handler "
        "sees ctx.should_stop, and the job ends cancelled when it returns. Finished jobs are "
        "left as they are."
    ),
)


def retry_button_label(job: Job) -> str:
    """'Retry now' for a failed job, 'Run now' for one scheduled later; '' when neither."""
    if job.state == State.FAILED:
        return "Retry now"
    if job.state == State.READY and job.run_at > timezone.now():
        return "Run now"
    return ""


def cancel_button_label(job: Job) -> str:
    """'Cancel' for a ready job, 'Cancel (ask it to stop)' for a running one not yet asked."""
    if job.state == State.READY:
        return "Cancel"
    if job.state == State.RUNNING and job.cancel_requested_at is None:
        return "Cancel (ask it to stop)"
    return ""


# ---------------------------------------------------------------- forms


class CleanupForm(forms.Form):
    older_than = forms.CharField(
        initial="7d",
        help_text="Finished more than this long ago: 30m, 12h, 7d, 2w.",
        max_length=20,
    )
    states = forms.MultipleChoiceField(
        choices=[(state.value, state.label) for state in FINISHED_STATES],
        initial=[state.value for state in FINISHED_STATES],
        widget=forms.CheckboxSelectMultiple,
    )

    def clean_older_than(self) -> timedelta:
        try:
            return as_age(self.cleaned_data["older_than"])
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None


# ---------------------------------------------------------------- the job admin


JOB_TIMES = (
    "enqueued_at",
    "run_at",
    "started_at",
    "finished_at",
    "last_merged_at",
    "lease_expires_at",
    "cancel_requested_at",
    "periodic_tick",
)


class JobAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """The job page's form: its times are shown by `to_the_second`, with the fields' help."""

    class Meta:
        help_texts = help_texts(Job, JOB_TIMES)


@admin.register(Job)
class JobAdmin(JobAdminBase):
    form = JobAdminForm
    enqueued_at_text = to_the_second(Job, "enqueued_at")
    run_at_text = to_the_second(Job, "run_at")
    started_at_text = to_the_second(Job, "started_at")
    finished_at_text = to_the_second(Job, "finished_at")
    last_merged_at_text = to_the_second(Job, "last_merged_at")
    lease_expires_at_text = to_the_second(Job, "lease_expires_at")
    cancel_requested_at_text = to_the_second(Job, "cancel_requested_at")
    periodic_tick_text = to_the_second(Job, "periodic_tick")
    # Fits a 1366 px screen beside the admin's navigation and the filters: the kind and
    # the error share what the other columns leave, cut with an ellipsis (the whole text
    # in their title); a live job's progress sits under its time in state; the priority
    # is a filter and on the job page.
    list_display = (
        "id",
        "kind_cell",
        "queue",
        "state_label",
        "attempt",
        "time_in_state",
        "enqueued",
        "error_summary",
    )
    list_display_links = ("id", "kind_cell")
    list_filter = ("state", KindFilter, QueueFilter, "priority", HasErrorFilter)
    search_fields = ("kind", "dedup_key", "payload")
    search_help_text = "A job id (123 or #123), or part of the kind, the dedup key or the payload."
    ordering = ("-id",)
    list_per_page = 50
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    actions = ("retry_now", "cancel_jobs", "delete_selected")
    fieldsets = (
        (None, {"fields": ("kind", "queue", "priority", "rank", "state", "dedup_key")}),
        ("Payload", {"fields": ("payload_json", "carry_json", "result_json")}),
        (
            "Runs",
            {
                "fields": (
                    "attempt",
                    "failures",
                    "merged_count",
                    "last_merged_at_text",
                    "last_error_text",
                    "progress_text",
                    "state_history_table",
                )
            },
        ),
        (
            "Workflow",
            {"fields": ("waiting_for", "dependencies_list", "dependents_list")},
        ),
        (
            "Times",
            {"fields": ("enqueued_at_text", "run_at_text", "started_at_text", "finished_at_text")},
        ),
        (
            "Claim",
            {
                "fields": (
                    "claimed_by",
                    "claim_token",
                    "lease_expires_at_text",
                    "cancel_requested_at_text",
                    "periodic_tick_text",
                ),
                "classes": ("collapse",),
            },
        ),
    )
    readonly_fields = (
        "kind",
        "queue",
        "priority",
        "rank",
        "state",
        "dedup_key",
        "payload_json",
        "carry_json",
        "result_json",
        "attempt",
        "failures",
        "merged_count",
        "last_merged_at_text",
        "last_error_text",
        "state_history_table",
        "enqueued_at_text",
        "run_at_text",
        "started_at_text",
        "finished_at_text",
        "claimed_by",
        "claim_token",
        "lease_expires_at_text",
        "progress_text",
        "cancel_requested_at_text",
        "periodic_tick_text",
        "waiting_for",
        "dependencies_list",
        "dependents_list",
    )
    inlines = (JournalInline,)

    # ------------------------------------------------------------ columns

    @admin.display(description="kind", ordering="kind")
    def kind_cell(self, job: Job) -> SafeString:
        return cut(job.kind)

    @admin.display(description="state", ordering="state")
    def state_label(self, job: Job) -> SafeString:
        return format_html('<span class="venturi-state venturi-{}">{}</span>', job.state, job.state)

    @admin.display(description="in this state", ordering="run_at")
    def time_in_state(self, job: Job) -> SafeString | str:
        """`state_age`, and under it the progress of a live job (`ctx.progress()`)."""
        age = state_age(job, timezone.now())
        if job.progress is None or job.state not in LIVE_STATES:
            return age
        return format_html("{}<br>{}", age, cut(progress_text(job.progress)))

    @admin.display(description="enqueued", ordering="enqueued_at")
    def enqueued(self, job: Job) -> SafeString | str:
        return date_over_time(job.enqueued_at)

    @admin.display(description="last error")
    def error_summary(self, job: Job) -> SafeString | str:
        """The first line of a current error (`has_current_error`); nothing for an old one."""
        if not has_current_error(job):
            return ""
        first_line = job.last_error.strip().splitlines()[0] if job.last_error.strip() else ""
        error_type, colon, message = first_line.partition(": ")
        # A give-up says so first; the state column says it too, so show the error itself.
        message = message.partition(GAVE_UP_SEPARATOR)[2] or message
        if error_type.startswith(OUTCOME_TYPE_PREFIX):  # `Outcome.failed: reason` -> `reason`
            first_line = message
        elif colon and " " not in error_type:  # `package.module.Error: message` -> `Error: message`
            first_line = f"{error_type.rpartition('.')[2]}: {message}"
        return cut(first_line, title=job.last_error)

    # ------------------------------------------------------------ the job page

    @admin.display(description="payload")
    def payload_json(self, job: Job) -> SafeString:
        return pretty_json(job.masked_payload())

    @admin.display(description="carry")
    def carry_json(self, job: Job) -> SafeString:
        return pretty_json(job.carry)

    @admin.display(description="result")
    def result_json(self, job: Job) -> SafeString:
        return pretty_json(job.result)

    @admin.display(description="enqueued after")
    def dependencies_list(self, job: Job) -> SafeString | str:
        """The jobs this one waits (or waited) for, with their states."""
        alias = job._state.db or venturi_settings.DATABASE
        return workflow_links(Job.objects.using(alias).filter(dependent_links__dependent=job))

    @admin.display(description="jobs enqueued after it")
    def dependents_list(self, job: Job) -> SafeString | str:
        """The jobs that wait (or waited) for this one, with their states."""
        alias = job._state.db or venturi_settings.DATABASE
        return workflow_links(Job.objects.using(alias).filter(dependency_links__dependency=job))

    @admin.display(description="last error")
    def last_error_text(self, job: Job) -> SafeString | str:
        if not job.last_error:
            return "-"
        if has_current_error(job):
            return format_html("<pre>{}</pre>", job.last_error)
        return format_html(
            '<div class="venturi-earlier">From an earlier run; the job is {} now.</div>'
            "<pre>{}</pre>",
            job.state,
            job.last_error,
        )

    @admin.display(description="state history")
    def state_history_table(self, job: Job) -> SafeString:
        entries = list(job.journal.using(job._state.db or venturi_settings.DATABASE).order_by("id"))
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td></tr>",
            ((compact_time(at) or "-", event) for at, event in state_history(job, entries)),
        )
        return format_html('<table class="venturi-history"><tbody>{}</tbody></table>', rows)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        """Jobs live in `VENTURI["DATABASE"]`, which need not be `default`."""
        return super().get_queryset(request).using(venturi_settings.DATABASE)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        refuse_unstorable_parameters(request)
        return super().get_changelist_instance(request)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """A number is a job id (one index lookup); text is looked for in kind, key and payload.

        Text search reads every row (`icontains`), so it takes seconds on millions of jobs;
        an id never does. The autocomplete of a job field searches here too.
        """
        term = search_term.strip().removeprefix("#")
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return search_jobs(queryset, search_term), False

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """No filter on the payload from the URL (`?payload__password__startswith=a`).

        Django allows any lookup on the model's own fields; one on the payload would
        test a secret field's value without showing it, one guess at a time.
        """
        if lookup.split(LOOKUP_SEP)[0] == "payload":
            return False
        return super().lookup_allowed(lookup, value, request)

    # ------------------------------------------------------------ permissions

    @admin.display(description="progress")
    def progress_text(self, job: Job) -> str:
        return progress_text(job.progress)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # fields are never edited: jobs change through the actions only

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_venturi.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_venturi.cancel_job")

    def has_cleanup_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_venturi.cleanup_jobs")

    def get_deleted_objects(
        self, objs: Sequence[Job] | QuerySet[Job], request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        """A job's journal goes with it: deleting a job needs no permission on journal entries."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(str(JournalEntry._meta.verbose_name))
        return deleted, counts, perms_needed, protected

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        """The delete view: the stats keep the job's runs (`retention.delete_jobs`)."""
        delete_jobs(Job.objects.filter(pk=obj.pk), using=venturi_settings.DATABASE)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """The delete action: the stats keep the jobs' runs (`retention.delete_jobs`)."""
        delete_jobs(queryset, using=venturi_settings.DATABASE)

    # ------------------------------------------------------------ actions

    @admin.action(description="Retry now (ready or failed jobs run at once)", permissions=["retry"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        if request.POST.get("post") != "yes":
            return self._confirm(request, queryset, RETRY)
        result = retry_now(queryset.values_list("id", flat=True), using=queryset.db)
        self.message_user(request, f"{jobs(len(result.retried))} will run now.", messages.SUCCESS)
        if result.clashes:
            self.message_user(
                request,
                "Left failed, because another ready job has the same kind and dedup key: "
                + ", ".join(f"#{job_id}" for job_id in result.clashes),
                messages.WARNING,
            )
        if result.skipped:
            skipped = len(result.skipped)
            left = "left as it is" if skipped == 1 else "left as they are"
            self.message_user(
                request, f"{jobs(skipped)} neither ready nor failed: {left}.", messages.INFO
            )
        return None

    @admin.action(description="Cancel (running jobs are asked to stop)", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        if request.POST.get("post") != "yes":
            return self._confirm(request, queryset, CANCEL)
        result = cancel(list(queryset.values_list("id", flat=True)), using=queryset.db)
        self.message_user(
            request,
            f"{jobs(result.cancelled)} cancelled; {jobs(result.stopping)} running asked to stop.",
            messages.SUCCESS,
        )
        return None

    def _confirm(
        self, request: HttpRequest, queryset: QuerySet[Job], action: Confirmation
    ) -> TemplateResponse:
        """The intermediate page: the selection again, with a button that posts it back."""
        listed = list(queryset.order_by("-id")[:CONFIRM_LISTED])
        total = queryset.count() if len(listed) == CONFIRM_LISTED else len(listed)
        context = {
            **self.admin_site.each_context(request),
            "title": action.title,
            "explanation": action.explanation,
            "opts": self.model._meta,
            "action": action.name,
            "jobs": listed,
            "total": total,
            "selected_ids": request.POST.getlist(ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_venturi/job/confirm_action.html", context)

    # ------------------------------------------------------------ extra pages

    def get_urls(self) -> list[URLPattern]:
        def view(function: Callable[[HttpRequest], HttpResponse], name: str) -> URLPattern:
            return path(
                f"{name}/",
                self.admin_site.admin_view(function),
                name=f"django_venturi_job_{name}",
            )

        def button(action: Confirmation) -> URLPattern:
            def answer(request: HttpRequest, object_id: str) -> HttpResponse:
                return self.button_view(request, object_id, action)

            return path(
                f"<path:object_id>/{action.button}/",
                self.admin_site.admin_view(answer),
                name=f"django_venturi_job_{action.button}",
            )

        return [
            view(self.stats_view, "stats"),
            view(lambda request: pause_admin.answer(request, resuming=False), "pause"),
            view(lambda request: pause_admin.answer(request, resuming=True), "resume"),
            view(self.cleanup_view, "cleanup"),
            button(RETRY),
            button(CANCEL),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, unquote(object_id))
        extra = {
            "job_buttons": self.job_buttons(request, job) if job else [],
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, extra)

    def job_buttons(self, request: HttpRequest, job: Job) -> list[dict[str, str]]:
        """The job page's Retry and Cancel buttons that apply to its state and the user."""
        buttons = []
        retry_label = retry_button_label(job)
        if retry_label and self.has_retry_permission(request):
            buttons.append({"label": retry_label, "url": self.button_url(RETRY, job)})
        cancel_label = cancel_button_label(job)
        if cancel_label and self.has_cancel_permission(request):
            buttons.append({"label": cancel_label, "url": self.button_url(CANCEL, job)})
        return buttons

    def button_url(self, action: Confirmation, job: Job) -> str:
        return reverse(f"admin:django_venturi_job_{action.button}", args=[quote(job.pk)])

    def button_view(
        self, request: HttpRequest, object_id: str, action: Confirmation
    ) -> HttpResponse:
        """A job page's button: the list action's confirmation, then the action on this job."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404(f"no job with id {object_id!r}")
        allowed = self.has_retry_permission if action is RETRY else self.has_cancel_permission
        if not self.has_view_permission(request, job) or not allowed(request):
            raise PermissionDenied
        list_action = self.retry_now if action is RETRY else self.cancel_jobs
        confirmation = list_action(request, self.get_queryset(request).filter(pk=job.pk))
        return confirmation or HttpResponseRedirect(
            reverse("admin:django_venturi_job_change", args=[quote(job.pk)])
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {
            "can_cleanup": self.has_cleanup_permission(request),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    def stats_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        snapshot = stats(using=venturi_settings.DATABASE)
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue stats",
            "opts": self.model._meta,
            "snapshot": snapshot,
            "live_rows": live_rows(snapshot),
            "latency_rows": latency_rows(snapshot),
            "orphan_rows": orphan_rows(snapshot),
            "chart": chart(snapshot),
            "workers": [
                {"worker": worker, "age": short_age(snapshot.taken_at - worker.heartbeat_at)}
                for worker in snapshot.workers
            ],
            "stale_after": short_age(registration.stale_after()),
            "last_hour_rows": last_hour_by_kind(venturi_settings.DATABASE, snapshot),
            "refresh": refresh_seconds(request),
            **pause_admin.pause_context(request, snapshot),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_venturi/job/stats.html", context)

    def cleanup_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_cleanup_permission(request):
            raise PermissionDenied
        form = CleanupForm(request.POST or None)
        preview = None
        if request.method == "POST" and form.is_valid():
            options = {
                "older_than": form.cleaned_data["older_than"],
                "states": form.cleaned_data["states"],
                "using": venturi_settings.DATABASE,
            }
            if "confirm" in request.POST:
                result = cleanup(**options)
                self.message_user(
                    request,
                    f"Deleted {result.counts()} {result.in_batches()}.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(reverse("admin:django_venturi_job_changelist"))
            preview = cleanup(dry_run=True, **options)
        context = {
            **self.admin_site.each_context(request),
            "title": "Clean up finished jobs",
            "opts": self.model._meta,
            "form": form,
            "preview": preview,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_venturi/job/cleanup.html", context)


def cut(text: str, *, title: str | None = None) -> SafeString:
    """A list cell's text, cut with an ellipsis by the style sheet; the whole of it on hover."""
    return format_html('<span class="venturi-cut" title="{}">{}</span>', title or text, text)


def jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def pretty_json(value: Any) -> SafeString:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True))


# ---------------------------------------------------------------- the stats page


def live_rows(snapshot: Stats) -> list[dict[str, Any]]:
    """One row per kind and queue with its waiting, ready and running counts."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for (state, kind, queue), jobs in snapshot.live.items():
        row = rows.setdefault(
            (kind, queue), {"kind": kind, "queue": queue, "waiting": 0, "ready": 0, "running": 0}
        )
        row[state] = jobs
    return [rows[key] for key in sorted(rows)]


def refresh_seconds(request: HttpRequest) -> int | None:
    """`?refresh=10` reloads the stats page every 10 s (at least 2 s; none by default)."""
    value = request.GET.get("refresh", "")
    return max(int(value), 2) if value.isdigit() and int(value) > 0 else None


def last_hour_by_kind(alias: str, snapshot: Stats) -> list[dict[str, Any]]:
    """The journal's last hour by kind and queue: jobs that finished and other runs.

    Jobs deleted since (cleanup, retention) are not in it; the totals count them.
    """
    if not snapshot.minutes:
        return []
    entries = (
        JournalEntry.objects.using(alias)
        .filter(finished_at__gte=snapshot.minutes[0].start)
        .values("job__kind", "job__queue")
        .annotate(**tallies.column_counts())
        .values_list("job__kind", "job__queue", *tallies.COLUMNS)
        .order_by("job__kind", "job__queue")
    )
    columns = ("completed", "failed", "retried", "other")
    return [
        {"kind": kind, "queue": queue, **dict(zip(columns, figures, strict=True))}
        for kind, queue, *figures in entries
    ]


def orphan_rows(snapshot: Stats) -> list[dict[str, Any]]:
    return [
        {**orphan.as_dict(), "oldest": short_age(orphan.oldest_due_age)}
        for orphan in snapshot.orphan_kinds
    ]


def latency_rows(snapshot: Stats) -> list[dict[str, Any]]:
    return [
        {
            "queue": queue,
            "due": snapshot.due.get(queue, 0),
            "oldest": short_age(snapshot.oldest_due_age[queue]),
        }
        for queue in sorted(snapshot.due)
    ]


def chart(snapshot: Stats) -> dict[str, Any]:
    """Bars for the last hour, one per minute, scaled to the busiest: failed jobs at the
    bottom, retried runs on them, completed jobs on top."""
    busiest = max((m.completed + m.failed + m.retried for m in snapshot.minutes), default=0) or 1
    scale = (CHART_HEIGHT - 20) / busiest
    bars = []
    for index, minute in enumerate(snapshot.minutes):
        failed_height = round(minute.failed * scale, 1)
        retried_height = round(minute.retried * scale, 1)
        completed_height = round(minute.completed * scale, 1)
        finished = minute.completed + minute.failed
        rate = f"{100 * minute.failed / finished:.0f}%" if finished else "-"
        bars.append(
            {
                "x": index * CHART_BAR_WIDTH,
                "failed_y": CHART_HEIGHT - failed_height,
                "failed_height": failed_height,
                "retried_y": CHART_HEIGHT - failed_height - retried_height,
                "retried_height": retried_height,
                "completed_y": CHART_HEIGHT - failed_height - retried_height - completed_height,
                "completed_height": completed_height,
                "label": (
                    f"{timezone.localtime(minute.start):%H:%M}: {minute.completed} completed, "
                    f"{minute.failed} failed ({rate}) jobs; {minute.retried} retried, "
                    f"{minute.other} other runs"
                ),
            }
        )
    ticks = [
        {"x": index * CHART_BAR_WIDTH, "label": f"{timezone.localtime(minute.start):%H:%M}"}
        for index, minute in enumerate(snapshot.minutes)
        if index % 15 == 0
    ]
    return {
        "bars": bars,
        "ticks": ticks,
        "width": CHART_BAR_WIDTH * len(snapshot.minutes),
        "height": CHART_HEIGHT,
        "full_height": CHART_HEIGHT + 16,
        "tick_y": CHART_HEIGHT + 12,
        "bar_width": CHART_BAR_WIDTH - 2,
        "busiest": busiest if busiest > 1 or snapshot.completed_last_hour else 0,
        "failure_rate": f"{100 * snapshot.failure_rate:.1f}%",
    }


# ---------------------------------------------------------------- the journal


@admin.register(JournalEntry)
class JournalEntryAdmin(JournalEntryAdminBase):
    # Fits a 1366 px screen like the job list: the job and the error share what the
    # other columns leave, cut with an ellipsis (whole in their title); the worker is
    # on the entry's page.
    list_display = (
        "id",
        "job_cell",
        "attempt",
        "outcome",
        "started",
        "duration",
        "error_cell",
    )
    list_filter = ("outcome",)
    list_select_related = ("job",)
    search_fields = ("job__kind", "error_type", "error_message")
    search_help_text = (
        "A job id (123 or #123) for that job's runs, or part of the kind, the error type "
        "or the error message."
    )
    ordering = ("-id",)
    readonly_fields = (
        "job",
        "attempt",
        "worker",
        "started_at_text",
        "finished_at_text",
        "outcome",
        "error_type",
        "error_message",
        "traceback",
    )
    fields = readonly_fields
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    started_at_text = to_the_second(JournalEntry, "started_at")
    finished_at_text = to_the_second(JournalEntry, "finished_at")

    @admin.display(description="job", ordering="job_id")
    def job_cell(self, entry: JournalEntry) -> SafeString:
        return cut(f"#{entry.job_id} {entry.job.kind}")

    @admin.display(description="started at", ordering="started_at")
    def started(self, entry: JournalEntry) -> SafeString | str:
        return date_over_time(entry.started_at)

    @admin.display(description="duration")
    def duration(self, entry: JournalEntry) -> str:
        return run_duration(entry)

    @admin.display(description="error")
    def error_cell(self, entry: JournalEntry) -> SafeString | str:
        return (
            cut(ErrorInfo(entry.error_type, entry.error_message).summary())
            if entry.error_type
            else "-"
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[JournalEntry]:
        return super().get_queryset(request).using(venturi_settings.DATABASE)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        refuse_unstorable_parameters(request)
        return super().get_changelist_instance(request)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JournalEntry], search_term: str
    ) -> tuple[QuerySet[JournalEntry], bool]:
        """A number is a job id: that job's runs. Text searches what the list and page show
        (never a payload, so never a secret field)."""
        term = search_term.strip().removeprefix("#")
        if term.isdigit():
            return queryset.filter(job_id=int(term)), False
        return super().get_search_results(request, queryset, search_term)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: JournalEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: JournalEntry | None = None) -> bool:
        return False  # the journal is append-only


def progress_text(progress: object) -> str:
    """`ctx.progress()` as one short line: "40 / 100 (40%) resizing images"."""
    if not isinstance(progress, dict):
        return "-"
    done, total, note = progress.get("done"), progress.get("total"), progress.get("note") or ""
    text = f"{done}"
    if isinstance(total, int | float) and total:
        text += f" / {total} ({100 * float(done or 0) / total:.0f}%)"
    return f"{text} {note}".strip()


