"""The periodic page's run now, disable and enable: each asks first, then acts and says so.

`django_venturi.manage_schedules` ("Can run, disable and enable periodic
schedules") guards the three, on the confirmation page (GET) as on the action
(POST); seeing the page needs only the view permission on periodic tasks.

Each action is journaled in the admin's own log (`LogEntry`, as Django's change
views do): the user who acted, when, and what, on the schedule's `ScheduleState`
row, so it is in "Recent actions" and in the audit trail a site already keeps.
The row itself holds who last disabled or enabled the schedule, for the page.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import reverse

from django_venturi.admin.breadcrumbs import job_page_breadcrumbs
from django_venturi.conf import venturi_settings
from django_venturi.enqueue import enqueue_one
from django_venturi.periodic import Schedule, schedules
from django_venturi.store.schedule_states import seen, set_enabled

PERMISSION = "django_venturi.manage_schedules"


@dataclasses.dataclass(frozen=True)
class ScheduleAction:
    """One of the three: its URL's last part, its button, its confirmation page."""

    name: str
    label: str
    title: str
    explanation: str


RUN_NOW = ScheduleAction(
    name="run",
    label="Run now",
    title="Run this schedule's task now?",
    explanation=(
        "Enqueues one job of the task, with the schedule's payload, to run at once, as a "
        "tick would (a ready job of its dedup key in the way is merged as usual). It takes "
        "no tick: the next tick runs as planned, once."
    ),
)
DISABLE = ScheduleAction(
    name="disable",
    label="Disable",
    title="Disable this schedule?",
    explanation=(
        "Workers skip its ticks (each is recorded as skipped) until it is enabled again, "
        "across deploys and restarts; jobs already enqueued are left as they are."
    ),
)
ENABLE = ScheduleAction(
    name="enable",
    label="Enable",
    title="Enable this schedule?",
    explanation=(
        "Workers enqueue its ticks again from the next one; a tick that came due while it "
        "was disabled was skipped and does not run."
    ),
)
ACTIONS = (RUN_NOW, DISABLE, ENABLE)


def can_manage(request: HttpRequest) -> bool:
    return request.user.has_perm(PERMISSION)


def action_url(action: ScheduleAction, kind: str) -> str:
    return reverse(f"admin:django_venturi_periodictask_{action.name}", args=[quote(kind)])


def answer(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, kind: str, action: ScheduleAction
) -> HttpResponse:
    """GET: the confirmation page; POST: the action, then back to the periodic page."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if not model_admin.has_view_permission(request) or not can_manage(request):
        raise PermissionDenied
    schedule = next((found for found in schedules() if found.kind == kind), None)
    if schedule is None:
        raise Http404(f"no periodic schedule of the task {kind!r}")
    if request.method != "POST":
        return confirm(model_admin, request, schedule, action)
    said = act(model_admin, request, schedule, action)
    messages.success(request, said)
    return HttpResponseRedirect(reverse("admin:django_venturi_periodictask_changelist"))


def act(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    schedule: Schedule,
    action: ScheduleAction,
) -> str:
    """Do it, journal it in the admin's log under the user's name, and say what was done."""
    alias = venturi_settings.DATABASE
    user = request.user.get_username() or "admin"
    if action is RUN_NOW:
        job = enqueue_one(schedule.instance(), using=alias)
        said = f"{schedule.kind}: job #{job.pk} enqueued to run now."
        done = f"Ran now: job #{job.pk}."
    else:
        enabled = action is ENABLE
        changed = set_enabled(alias, schedule.kind, enabled=enabled, by=user)
        state = "enabled" if enabled else "disabled"
        said = f"{schedule.kind}: {state}." if changed else f"{schedule.kind} was {state} already."
        done = f"{state.capitalize()}." if changed else f"{state.capitalize()} (it was already)."
    model_admin.log_change(request, seen(alias, schedule.kind), done)
    return said


def confirm(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    schedule: Schedule,
    action: ScheduleAction,
) -> TemplateResponse:
    """The page that asks, with a button that posts back to the same URL."""
    request.current_app = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": action.title,
        "breadcrumbs": job_page_breadcrumbs(model_admin, request, action.title),
        "opts": model_admin.model._meta,
        "explanation": action.explanation,
        "schedule": schedule,
        "action": action,
    }
    return TemplateResponse(request, "admin/django_venturi/schedule_confirm.html", context)
