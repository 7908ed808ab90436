"""The per-kind page: one kind's history, failure rate, live jobs, limits, caps and pause state.

Reached from any kind name (the job list's kind column, the stats page's
tables) at `<admin>/django_venturi/job/kinds/<kind>/`, for the view permission,
as the stats page is. Its history is the stats page's, filtered by the kind
(`history_pages.py`); the caps and rate limits are counted now, as the stats
page counts them. The latest errors grouped by type come from another change:
the template keeps a marked block for them.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Count
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from django_venturi.admin.breadcrumbs import job_page_breadcrumbs
from django_venturi.admin.error_groups import error_groups
from django_venturi.admin.history_pages import history_context
from django_venturi.admin.pauses import can_pause
from django_venturi.admin.stats import refresh_seconds
from django_venturi.conf import venturi_settings
from django_venturi.models import Job
from django_venturi.observe import cap_stats, rate_limit_stats
from django_venturi.registry import TaskSpec, registry
from django_venturi.states import LIVE_STATES
from django_venturi.store.clock import database_time
from django_venturi.store.pauses import paused


def kind_url(kind: str, site: str = "admin") -> str:
    """The per-kind page of `kind` in the admin site named `site`."""
    return reverse(f"{site}:django_venturi_job_kind", args=[kind])


def kind_page(
    model_admin: admin.ModelAdmin[Job], request: HttpRequest, kind: str
) -> TemplateResponse:
    """One kind: its history, failure rate, current errors grouped by type and first line,
    live jobs, limits, caps and pause state."""
    alias = venturi_settings.DATABASE
    request.current_app = model_admin.admin_site.name
    now = database_time(alias, statement=True)
    spec = registry.find(kind)
    live = dict(
        Job.objects.using(alias)
        .filter(kind=kind, state__in=LIVE_STATES)
        .values_list("state")
        .annotate(jobs=Count("id"))
        .order_by()
    )
    pauses = [item for item in paused(using=alias) if item.scope == "kind" and item.name == kind]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Kind {kind}",
        "breadcrumbs": job_page_breadcrumbs(model_admin, request, f"Kind {kind}"),
        "opts": model_admin.model._meta,
        "kind": kind,
        "spec": spec,
        "settings_rows": _spec_rows(spec),
        "live": {state: live.get(state, 0) for state in ("ready", "waiting", "running")},
        "caps": [use for use in cap_stats.usage(alias, now) if use.kind == kind],
        "rate_limits": [use for use in rate_limit_stats.usage(alias, now) if use.kind == kind],
        "kind_pauses": pauses,
        "groups": error_groups(kind, using=alias),
        "can_pause": can_pause(request),
        "refresh": refresh_seconds(request),
        **history_context(request, kind=kind),
    }
    return TemplateResponse(request, "admin/django_venturi/job/kind.html", context)


def _spec_rows(spec: TaskSpec | None) -> list[tuple[str, object]]:
    """The task's options as the decorator set them (none for a kind no code defines)."""
    if spec is None:
        return []
    return [
        ("queue", spec.queue or venturi_settings.DEFAULT_QUEUE),
        ("priority", spec.priority.name),
        ("max attempts", "worker default" if spec.max_attempts is None else spec.max_attempts),
        ("give up after", spec.give_up_after or "-"),
        ("lease", spec.lease or venturi_settings.DEFAULT_LEASE),
        ("timeout", spec.timeout or "-"),
        ("concurrency cap", spec.concurrency or "none"),
        ("rate limit", spec.rate_limit or "none"),
        ("fair by", spec.fair_by or "-"),
        ("atomic", "yes" if spec.atomic else "no"),
    ]
