"""The job admin: the job list, a job's page and the extra pages, registered on `Job`.

- The job list stays fast on a table of millions: filters whose choices come from
  the registry and the model (no DISTINCT over the table), no related rows per
  line, and an estimated count once the result passes `EXACT_COUNT_LIMIT`
  (`job_list`).
- A job's page shows its payload, carry and result as indented JSON, the states
  it went through, and its journal with folded tracebacks (`job_page`); no page
  shows a `venturi.secret()` value, in any shape or copied anywhere (`masking`).
- Actions, each behind its own permission and a confirmation page (`actions`):
  retry now (`retry_job`), cancel (`cancel_job`), delete (Django's delete
  permission), and a cleanup page for old finished jobs (`cleanup_jobs`; `cleanup`).
- A stats page (view permission) draws `venturi.stats()`: live counts, queue
  latency, the last hour per minute as an SVG chart, and the live workers (`stats`),
  with the pause buttons (`pauses`).

Fields are never editable here: jobs change only through these actions. This
module declares what the pages show and who may do what; the modules named above
hold how.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_venturi.admin import bulk_actions, cleanup, history_pages, kind_page, stats
from django_venturi.admin import pauses as pause_admin
from django_venturi.admin.actions import (
    CANCEL,
    RETRY,
    Confirmation,
    button_url,
    cancel_action,
    cancel_button_label,
    refuse_unusable_selection,
    retry_action,
    retry_button_label,
)
from django_venturi.admin.display import (
    compact_time,
    cut,
    date_over_time,
    error_cell,
    pretty_json,
    progress_text,
    to_the_second,
)
from django_venturi.admin.error_groups import error_groups_of_list
from django_venturi.admin.filters import EnqueuedFilter, ErrorTypeFilter, FinishedFilter
from django_venturi.admin.job_list import (
    EstimatedCountPaginator,
    HasErrorFilter,
    KindFilter,
    QueueFilter,
    checked_changelist,
    has_current_error,
    job_id_search,
    search_jobs,
    state_age,
)
from django_venturi.admin.job_page import (
    JOB_FIELDSETS,
    JOB_READONLY_FIELDS,
    JobAdminForm,
    JournalInline,
    state_history,
    trace_link,
    workflow_links,
)
from django_venturi.admin.masking import UNFILTERED_FIELDS, job_mask
from django_venturi.conf import venturi_settings
from django_venturi.models import Job, JournalEntry
from django_venturi.states import LIVE_STATES
from django_venturi.store.retention import delete_jobs
from django_venturi.store.verdicts import GAVE_UP_SEPARATOR, OUTCOME_TYPE_PREFIX

if TYPE_CHECKING:
    JobAdminBase = admin.ModelAdmin[Job]
else:
    JobAdminBase = admin.ModelAdmin


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
    list_display_links = ("id",)
    list_filter = (
        "state",
        KindFilter,
        QueueFilter,
        "priority",
        HasErrorFilter,
        ErrorTypeFilter,
        ("enqueued_at", EnqueuedFilter),
        ("finished_at", FinishedFilter),
    )
    search_fields = ("kind", "dedup_key", "payload")
    search_help_text = "A job id (123 or #123), or part of the kind, the dedup key or the payload."
    ordering = ("-id",)
    list_per_page = 50
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    actions = ("retry_now", "cancel_jobs", "delete_selected")
    fieldsets = JOB_FIELDSETS
    readonly_fields = JOB_READONLY_FIELDS
    inlines = (JournalInline,)

    # ------------------------------------------------------------ columns

    @admin.display(description="kind", ordering="kind")
    def kind_cell(self, job: Job) -> SafeString:
        """The kind, a link to its page (`history_pages.kind_page`)."""
        return format_html(
            '<a href="{}">{}</a>', kind_page.kind_url(job.kind, self.admin_site.name), cut(job.kind)
        )

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
        last_error = job_mask(job).text(job.last_error)
        first_line = last_error.strip().splitlines()[0] if last_error.strip() else ""
        error_type, colon, message = first_line.partition(": ")
        # A give-up says so first; the state column says it too, so show the error itself.
        message = message.partition(GAVE_UP_SEPARATOR)[2] or message
        if error_type.startswith(OUTCOME_TYPE_PREFIX):  # `Outcome.failed: reason` -> `reason`
            first_line = message
        elif colon and " " not in error_type:  # `package.module.Error: message` -> `Error: message`
            first_line = f"{error_type.rpartition('.')[2]}: {message}"
        return error_cell(first_line, last_error)

    # ------------------------------------------------------------ the job page

    @admin.display(description="payload")
    def payload_json(self, job: Job) -> SafeString:
        return pretty_json(job.masked_payload())

    @admin.display(description="carry")
    def carry_json(self, job: Job) -> SafeString:
        return pretty_json(job_mask(job).carry())

    @admin.display(description="result")
    def result_json(self, job: Job) -> SafeString:
        return pretty_json(job_mask(job).result())

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
        last_error = job_mask(job).text(job.last_error)
        if has_current_error(job):
            return format_html("<pre>{}</pre>", last_error)
        return format_html(
            '<div class="venturi-earlier">From an earlier run; the job is {} now.</div>'
            "<pre>{}</pre>",
            job.state,
            last_error,
        )

    @admin.display(description="trace")
    def trace(self, job: Job) -> SafeString | str:
        """The trace that enqueued the job (`tracing.py`), a link with `TRACE_URL`."""
        return trace_link(job)

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

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Job | None:
        """An empty `?_to_field=` names no field: Django would look for a field named ""."""
        return super().get_object(request, object_id, from_field or None)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        return checked_changelist(request, super().get_changelist_instance)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """A number is a job id (one index lookup); text is looked for in kind, key and payload.

        Text search reads every row (`icontains`), so it takes seconds on millions of jobs;
        an id never does. The autocomplete of a job field searches here too.
        """
        found = job_id_search(request, queryset, search_term, "pk")
        if found is not None:
            return found, False
        return search_jobs(queryset, search_term), False

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """No filter on the payload from the URL (`?payload__password__startswith=a`).

        Django allows any lookup on the model's own fields; one on the payload would
        test a secret field's value without showing it, one guess at a time. The
        same holds for the carry, the result and the last error (`UNFILTERED_FIELDS`).
        """
        if lookup.split(LOOKUP_SEP)[0] in UNFILTERED_FIELDS:
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
        return retry_action(self, request, queryset)

    @admin.action(description="Cancel (running jobs are asked to stop)", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return cancel_action(self, request, queryset)

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        """Refuse selected values that are no job id before Django looks them up."""
        refused = refuse_unusable_selection(self, request)
        return refused or super().response_action(request, queryset, *args, **kwargs)

    # ------------------------------------------------------------ extra pages

    def get_urls(self) -> list[URLPattern]:
        def view(function: Callable[[HttpRequest], HttpResponse], name: str) -> URLPattern:
            return path(
                f"{name}/",
                self.admin_site.admin_view(function),
                name=f"django_venturi_job_{name}",
            )

        def bulk_view(action: bulk_actions.BulkAction) -> URLPattern:
            return view(lambda request: bulk_actions.answer(self, request, action), action.name)

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
            path(
                "stats/history/",
                self.admin_site.admin_view(self.stats_history_view),
                name="django_venturi_job_stats_history",
            ),
            path(
                "kinds/<path:kind>/",
                self.admin_site.admin_view(self.kind_view),
                name="django_venturi_job_kind",
            ),
            view(lambda request: pause_admin.answer(request, resuming=False), "pause"),
            view(lambda request: pause_admin.answer(request, resuming=True), "resume"),
            view(self.cleanup_view, "cleanup"),
            *(bulk_view(action) for action in bulk_actions.BULK_ACTIONS),
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
            buttons.append({"label": retry_label, "url": button_url(RETRY, job)})
        cancel_label = cancel_button_label(job)
        if cancel_label and self.has_cancel_permission(request):
            buttons.append({"label": cancel_label, "url": button_url(CANCEL, job)})
        return buttons

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
            "bulk_links": bulk_actions.links(self, request),
            "error_groups": error_groups_of_list(request),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    def stats_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return stats.stats_page(self, request)

    def stats_history_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return history_pages.history_json(request)

    def kind_view(self, request: HttpRequest, kind: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if history_pages.name_problem(kind):
            raise Http404("No kind can have this name.")
        return kind_page.kind_page(self, request, kind)

    def cleanup_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_cleanup_permission(request):
            raise PermissionDenied
        return cleanup.cleanup_page(self, request)
