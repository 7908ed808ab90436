"""Retry all and cancel all in this filter: every job the job list's filters select.

Django's list actions act on the rows ticked on a page; these act on the whole
filtered set, however many pages it spans. The job list links to them with its
own query string; each asks first (GET: how many jobs, and the newest of them),
then acts on POST, in batches (`store.bulk_actions`, each batch its own short
transaction), and journals what it did in the admin's log (`LogEntry`) under the
user's name. Each needs the view permission and the single action's own
(`retry_job`, `cancel_job`), on the confirmation page as on the action.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from django_venturi.admin.breadcrumbs import job_page_breadcrumbs
from django_venturi.admin.display import jobs
from django_venturi.models import Job
from django_venturi.store.bulk_actions import BATCH_SIZE, BulkResult, cancel_all, retry_all

if TYPE_CHECKING:
    from django_venturi.admin.jobs import JobAdmin

logger = logging.getLogger("django_venturi.admin")

LISTED = 20
"""The confirmation page names the newest this many jobs of the filter."""
TIME_BUDGET = 20.0
"""Seconds after which a request starts no further batch: it answers well before the
usual 30 to 60 s proxy timeouts, and says what is left to do (the action again does it)."""


@dataclasses.dataclass(frozen=True)
class BulkAction:
    """One of the two: its URL's name, its link, its page, what it runs."""

    name: str
    label: str
    title: str
    explanation: str
    permission: str
    run: Callable[..., BulkResult]


RETRY_ALL = BulkAction(
    name="retry_all",
    label="Retry all in this filter",
    title="Retry every job in this filter now?",
    explanation=(
        "Every ready or failed job the list's filters select (on every page, not only this "
        "one) becomes ready with run_at = now, as Retry now does; other jobs are left as they "
        "are. Done in batches, each its own short transaction."
    ),
    permission="retry",
    run=retry_all,
)
CANCEL_ALL = BulkAction(
    name="cancel_all",
    label="Cancel all in this filter",
    title="Cancel every job in this filter?",
    explanation=(
        "Every ready or waiting job the list's filters select (on every page) becomes "
        "cancelled; running ones are asked to stop, as Cancel does; finished jobs are left "
        "as they are. Done in batches, each its own short transaction."
    ),
    permission="cancel",
    run=cancel_all,
)
BULK_ACTIONS = (RETRY_ALL, CANCEL_ALL)


def allowed(model_admin: JobAdmin, request: HttpRequest, action: BulkAction) -> bool:
    has_permission = getattr(model_admin, f"has_{action.permission}_permission")
    return bool(model_admin.has_view_permission(request) and has_permission(request))


def links(model_admin: JobAdmin, request: HttpRequest) -> list[dict[str, str]]:
    """The job list's links to the actions the user may take, carrying its filters."""
    query = request.GET.urlencode()
    return [
        {"label": action.label, "url": action_url(action) + (f"?{query}" if query else "")}
        for action in BULK_ACTIONS
        if allowed(model_admin, request, action)
    ]


def action_url(action: BulkAction) -> str:
    return reverse(f"admin:django_venturi_job_{action.name}")


def answer(model_admin: JobAdmin, request: HttpRequest, action: BulkAction) -> HttpResponse:
    """GET: how many jobs the filter holds, and a button; POST: the action, then the list."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if not allowed(model_admin, request, action):
        raise PermissionDenied
    try:
        changelist = model_admin.get_changelist_instance(request)
    except IncorrectLookupParameters:  # never act on more than the filter meant
        messages.error(request, f"{action.label}: the filter cannot be used; nothing was done.")
        return HttpResponseRedirect(reverse("admin:django_venturi_job_changelist"))
    queryset: QuerySet[Job] = changelist.get_queryset(request)
    if request.method != "POST":
        return confirm(model_admin, request, queryset, action)
    started = time.monotonic()
    result = action.run(queryset, batch_size=BATCH_SIZE, time_budget=TIME_BUDGET)
    seconds = time.monotonic() - started
    said = summary(action, result)
    journal(request, action, said)
    logger.info(
        "%s by %s: %s",
        action.name,
        request.user.get_username(),
        said,
        extra={"action": action.name, "jobs": result.done, "seconds": round(seconds, 3)},
    )
    batches = "1 batch" if result.batches == 1 else f"{result.batches} batches"
    messages.success(request, f"{said} ({batches}, {seconds:.1f} s)")
    query = request.GET.urlencode()
    changelist_url = reverse("admin:django_venturi_job_changelist")
    return HttpResponseRedirect(f"{changelist_url}?{query}" if query else changelist_url)


def summary(action: BulkAction, result: BulkResult) -> str:
    if action is RETRY_ALL:
        said = f"{jobs(result.done)} will run now."
        if result.clashes:
            said += f" {jobs(result.clashes)} left failed: a ready job holds their dedup key."
    else:
        said = f"{jobs(result.done)} cancelled; {jobs(result.stopping)} running asked to stop."
    if not result.complete:
        said += f" Stopped after {TIME_BUDGET:.0f} s to answer in time: run it again for the rest."
    return said


def journal(request: HttpRequest, action: BulkAction, said: str) -> None:
    """One entry in the admin's log, under the user, naming the filter and the outcome."""
    filters = request.GET.urlencode() or "no filter"
    user_id = request.user.pk
    assert user_id is not None  # `admin_view` lets only a logged-in staff user through
    LogEntry.objects.create(
        user_id=user_id,
        content_type=ContentType.objects.get_for_model(Job),
        object_id=None,
        object_repr=f"{action.label}: {filters}"[:200],
        action_flag=CHANGE,
        change_message=said,
    )


def confirm(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Job],
    action: BulkAction,
) -> TemplateResponse:
    """The page that asks: the filter's size and newest jobs, and a button that posts back."""
    request.current_app = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": action.title,
        "breadcrumbs": job_page_breadcrumbs(model_admin, request, action.title),
        "opts": model_admin.model._meta,
        "explanation": action.explanation,
        "total": queryset.count(),
        "jobs": list(queryset.order_by("-id")[:LISTED]),
        "filters": request.GET.urlencode(),
    }
    return TemplateResponse(request, "admin/django_venturi/job/confirm_bulk.html", context)
