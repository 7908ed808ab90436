"""The Django admin: browse jobs and their journals."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_venturi.models import Job, JournalEntry

if TYPE_CHECKING:
    JobAdminBase = admin.ModelAdmin[Job]
    JournalEntryAdminBase = admin.ModelAdmin[JournalEntry]
    JournalInlineBase = admin.TabularInline[JournalEntry, Job]
else:
    JobAdminBase = JournalEntryAdminBase = admin.ModelAdmin
    JournalInlineBase = admin.TabularInline


class JournalInline(JournalInlineBase):
    model = JournalEntry
    extra = 0
    can_delete = False
    fields = (
        "attempt",
        "outcome",
        "worker",
        "started_at",
        "finished_at",
        "error_type",
        "error_message",
    )
    readonly_fields = fields
    ordering = ("id",)

    def has_add_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(JobAdminBase):
    list_display = (
        "id",
        "kind",
        "queue",
        "priority",
        "state",
        "attempt",
        "dedup_key",
        "merged_count",
        "run_at",
        "enqueued_at",
        "finished_at",
    )
    list_filter = ("state", "queue", "priority", "kind")
    search_fields = ("=id", "kind", "dedup_key")
    readonly_fields = (
        "kind",
        "queue",
        "priority",
        "state",
        "payload_json",
        "carry_json",
        "dedup_key",
        "merged_count",
        "last_merged_at",
        "attempt",
        "failures",
        "run_at",
        "enqueued_at",
        "started_at",
        "finished_at",
        "claim_token",
        "claimed_by",
        "lease_expires_at",
        "last_error",
    )
    exclude = ("payload", "carry")
    inlines = (JournalInline,)
    show_full_result_count = False

    @admin.display(description="payload")
    def payload_json(self, job: Job) -> SafeString:
        return format_html(
            "<pre>{}</pre>", json.dumps(job.masked_payload(), indent=2, sort_keys=True)
        )

    @admin.display(description="carry")
    def carry_json(self, job: Job) -> SafeString:
        return format_html("<pre>{}</pre>", json.dumps(job.carry, indent=2, sort_keys=True))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # read-only until the admin actions (retry, cancel) exist


@admin.register(JournalEntry)
class JournalEntryAdmin(JournalEntryAdminBase):
    list_display = ("id", "job", "attempt", "outcome", "worker", "started_at", "finished_at")
    list_filter = ("outcome",)
    list_select_related = ("job",)
    readonly_fields = (
        "job",
        "attempt",
        "worker",
        "started_at",
        "finished_at",
        "outcome",
        "error_type",
        "error_message",
        "traceback",
    )
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: JournalEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: JournalEntry | None = None) -> bool:
        return False  # the journal is append-only
