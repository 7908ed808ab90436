"""Retry now and cancel: the list actions, their confirmation page, the job page's buttons.

Each action asks first (`Confirmation`: its title and explanation, the same for
the list action and the job page's button), then changes the selected jobs
through `store/` and says what it did. `JobAdmin` declares the actions with
their permissions and calls `retry_action` and `cancel_action`; the button labels
say which of them applies to a job's state.
"""

from __future__ import annotations

import dataclasses
import reprlib

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from django_venturi.admin.breadcrumbs import job_page_breadcrumbs
from django_venturi.admin.display import jobs
from django_venturi.admin.job_list import typed_job_id
from django_venturi.models import Job
from django_venturi.states import State
from django_venturi.store.cancel import cancel
from django_venturi.store.retry import retry_now

CONFIRM_LISTED = 100
"""A confirmation page names at most this many of the selected jobs."""


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


def button_url(action: Confirmation, job: Job) -> str:
    return reverse(f"admin:django_venturi_job_{action.button}", args=[quote(job.pk)])


def refuse_unusable_selection(
    model_admin: admin.ModelAdmin[Job], request: HttpRequest
) -> HttpResponse | None:
    """Refuse a selection holding something that is no job id ("²", 5,000 digits, text).

    Django would look each value up as an id and fail the page; instead nothing is
    done and a message names the field. None when every selected value is a job id.
    """
    for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
        if typed_job_id(value) is None:
            model_admin.message_user(
                request,
                f"{ACTION_CHECKBOX_NAME}: {reprlib.repr(value)} is not a job id; nothing was done.",
                messages.ERROR,
            )
            return HttpResponseRedirect(request.get_full_path())
    return None


def retry_action(
    model_admin: admin.ModelAdmin[Job], request: HttpRequest, queryset: QuerySet[Job]
) -> HttpResponse | None:
    """The retry action: its confirmation page, then the retry and what became of each job."""
    if request.POST.get("post") != "yes":
        return confirm(model_admin, request, queryset, RETRY)
    result = retry_now(queryset.values_list("id", flat=True), using=queryset.db)
    model_admin.message_user(
        request, f"{jobs(len(result.retried))} will run now.", messages.SUCCESS
    )
    if result.clashes:
        model_admin.message_user(
            request,
            "Left failed, because another ready job has the same kind and dedup key: "
            + ", ".join(f"#{job_id}" for job_id in result.clashes),
            messages.WARNING,
        )
    if result.skipped:
        skipped = len(result.skipped)
        left = "left as it is" if skipped == 1 else "left as they are"
        model_admin.message_user(
            request, f"{jobs(skipped)} neither ready nor failed: {left}.", messages.INFO
        )
    return None


def cancel_action(
    model_admin: admin.ModelAdmin[Job], request: HttpRequest, queryset: QuerySet[Job]
) -> HttpResponse | None:
    """The cancel action: its confirmation page, then the cancel and how many stop."""
    if request.POST.get("post") != "yes":
        return confirm(model_admin, request, queryset, CANCEL)
    result = cancel(list(queryset.values_list("id", flat=True)), using=queryset.db)
    model_admin.message_user(
        request,
        f"{jobs(result.cancelled)} cancelled; {jobs(result.stopping)} running asked to stop.",
        messages.SUCCESS,
    )
    if result.already_finished:
        left = "left as it is" if result.already_finished == 1 else "left as they are"
        model_admin.message_user(
            request, f"{jobs(result.already_finished)} already finished: {left}.", messages.INFO
        )
    if result.unknown:
        model_admin.message_user(
            request, f"{jobs(result.unknown)} no longer there (deleted meanwhile).", messages.INFO
        )
    return None


def confirm(
    model_admin: admin.ModelAdmin[Job],
    request: HttpRequest,
    queryset: QuerySet[Job],
    action: Confirmation,
) -> TemplateResponse:
    """The intermediate page: the selection again, with a button that posts it back."""
    listed = list(queryset.order_by("-id")[:CONFIRM_LISTED])
    total = queryset.count() if len(listed) == CONFIRM_LISTED else len(listed)
    request.current_app = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": action.title,
        "breadcrumbs": job_page_breadcrumbs(model_admin, request, action.title),
        "explanation": action.explanation,
        "opts": model_admin.model._meta,
        "action": action.name,
        "jobs": listed,
        "total": total,
        "selected_ids": request.POST.getlist(ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "admin/django_venturi/job/confirm_action.html", context)
