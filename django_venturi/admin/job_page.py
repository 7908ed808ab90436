"""What a job's page shows beyond its fields: its runs, its states, its workflow, its trace.

The page's form (`JobAdminForm`, with the help texts of the times shown to the
second), the journal inline (one row per run, tracebacks folded), the states the
job went through (`state_history`, from its journal and `OUTCOME_LEADS_TO`), and
links to the jobs it waits for or that wait for it (`workflow_links`), and the
trace it was enqueued in (`trace_link`). The Retry
and Cancel buttons are in `actions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_venturi import tracing
from django_venturi.admin.display import help_texts, run_duration, to_the_second
from django_venturi.admin.masking import job_mask
from django_venturi.conf import venturi_settings
from django_venturi.models import Job, JournalEntry
from django_venturi.states import JournalOutcome, State

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec

    JournalInlineBase = admin.TabularInline[JournalEntry, Job]
else:
    JournalInlineBase = admin.TabularInline

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


JOB_FIELDSETS: _FieldsetSpec = (
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
                "trace",
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
"""A job's page: its fields by section (`*_text`: a time to the second, `JOB_TIMES`)."""
JOB_READONLY_FIELDS = tuple(str(name) for _, section in JOB_FIELDSETS for name in section["fields"])
"""Every field of the page: jobs change only through the actions."""


class JobAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """The job page's form: its times are shown by `to_the_second`, with the fields' help."""

    class Meta:
        help_texts = help_texts(Job, JOB_TIMES)


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
        # The job's secret values hidden: the page's own job, not one load per entry.
        mask = job_mask(self.job if self.job is not None else entry.job)
        summary = mask.text(f"{entry.error_type}: {entry.error_message}")
        if not entry.traceback:
            return summary
        return format_html(
            '<details class="venturi-traceback"><summary>{}</summary><pre>{}</pre></details>',
            summary,
            mask.text(entry.traceback),
        )

    job: Job | None = None
    """The job whose page shows this inline (`get_formset`)."""

    def get_formset(self, request: HttpRequest, obj: Job | None = None, **kwargs: Any) -> Any:
        self.job = obj  # an inline instance serves one request: Django makes one per page
        return super().get_formset(request, obj, **kwargs)

    def get_queryset(self, request: HttpRequest) -> QuerySet[JournalEntry]:
        return super().get_queryset(request).using(venturi_settings.DATABASE)

    def has_add_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False


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


def journal_outcome(value: str) -> JournalOutcome | None:
    """The outcome an entry names; None for one no venturi code writes (written by SQL)."""
    try:
        return JournalOutcome(value)
    except ValueError:
        return None


def state_history(job: Job, entries: Sequence[JournalEntry]) -> list[tuple[datetime | None, str]]:
    """The states a job went through, from its enqueue time and its journal."""
    events: list[tuple[datetime | None, str]] = [(job.enqueued_at, "enqueued: ready")]
    for entry in entries:
        if entry.outcome == JournalOutcome.DISCARDED:
            continue
        worker = f" by {entry.worker}" if entry.worker else ""
        events.append((entry.started_at, f"attempt {entry.attempt}{worker}: running"))
        outcome = journal_outcome(entry.outcome)
        next_state = OUTCOME_LEADS_TO.get(outcome) if outcome else None
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


def trace_link(job: Job) -> SafeString | str:
    """The id of the trace that enqueued the job: a link to it with `VENTURI["TRACE_URL"]`."""
    trace = tracing.trace_id(job.trace_context)
    if trace is None:
        return "-"
    url = tracing.trace_url(trace)
    if url is None:
        return format_html("<code>{}</code>", trace)
    return format_html(
        '<a href="{}" target="_blank" rel="noopener noreferrer"><code>{}</code></a>', url, trace
    )
