"""The journal's admin: every run of every job, read-only and append-only.

A list that fits a 1366 px screen (the job and error cut with an ellipsis), the
estimated count of the job list (`job_list.EstimatedCountPaginator`), and a
search where a number is a job id (that job's runs). Nothing here adds, changes
or deletes an entry; deleting a job deletes its entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString

from django_venturi.admin.display import cut, date_over_time, run_duration, to_the_second
from django_venturi.admin.job_list import EstimatedCountPaginator, refuse_unstorable_parameters
from django_venturi.conf import venturi_settings
from django_venturi.models import JournalEntry
from django_venturi.store.verdicts import ErrorInfo

if TYPE_CHECKING:
    JournalEntryAdminBase = admin.ModelAdmin[JournalEntry]
else:
    JournalEntryAdminBase = admin.ModelAdmin


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
