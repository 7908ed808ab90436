"""The journal's admin: every run of every job, read-only and append-only.

A list that fits a 1366 px screen (the job and error cut with an ellipsis), the
estimated count of the job list (`job_list.EstimatedCountPaginator`), and a
search where a number is a job id (that job's runs). Nothing here adds, changes
or deletes an entry; deleting a job deletes its entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest
from django.utils.safestring import SafeString

from django_venturi.admin.display import (
    cut,
    date_over_time,
    error_cell,
    run_duration,
    to_the_second,
)
from django_venturi.admin.filters import FinishedFilter, JournalErrorTypeFilter, JournalKindFilter
from django_venturi.admin.job_list import (
    EstimatedCountPaginator,
    checked_changelist,
    job_id_search,
    search_words,
)
from django_venturi.admin.masking import UNFILTERED_JOURNAL_FIELDS, job_mask, searchable
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
    list_filter = (
        "outcome",
        JournalKindFilter,
        JournalErrorTypeFilter,
        ("finished_at", FinishedFilter),
    )
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
        "error_message_text",
        "traceback_text",
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
        if not entry.error_type:
            return "-"
        mask = job_mask(entry.job)
        summary = ErrorInfo(entry.error_type, entry.error_message).summary()
        whole = f"{entry.error_type}: {entry.error_message}"
        return error_cell(mask.text(summary), mask.text(whole))

    @admin.display(description="error message")
    def error_message_text(self, entry: JournalEntry) -> str:
        """The message, with the values of the job's secret fields hidden (`masking`)."""
        return job_mask(entry.job).text(entry.error_message)

    @admin.display(description="traceback")
    def traceback_text(self, entry: JournalEntry) -> str:
        return job_mask(entry.job).text(entry.traceback)

    def get_queryset(self, request: HttpRequest) -> QuerySet[JournalEntry]:
        return super().get_queryset(request).using(venturi_settings.DATABASE)

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> JournalEntry | None:
        """An empty `?_to_field=` names no field: Django would look for a field named ""."""
        return super().get_object(request, object_id, from_field or None)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        return checked_changelist(request, super().get_changelist_instance)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JournalEntry], search_term: str
    ) -> tuple[QuerySet[JournalEntry], bool]:
        """A number is a job id: that job's runs. Text searches what the list and page show
        (never a payload); the error message only for kinds that cannot hold a secret
        (`masking.searchable`), since a handler's message may quote one."""
        found = job_id_search(request, queryset, search_term, "job_id")
        if found is not None:
            return found, False
        message_searchable = searchable("job__kind")
        for word in search_words(search_term):
            queryset = queryset.filter(
                Q(job__kind__icontains=word)
                | Q(error_type__icontains=word)
                | (Q(error_message__icontains=word) & message_searchable)
            )
        return queryset, False

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """No filter on a message or traceback from the URL: one may quote a secret."""
        if lookup.split(LOOKUP_SEP)[0] in UNFILTERED_JOURNAL_FIELDS:
            return False
        return super().lookup_allowed(lookup, value, request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: JournalEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: JournalEntry | None = None) -> bool:
        return False  # the journal is append-only
