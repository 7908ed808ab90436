"""The stats page: `venturi.stats()` drawn as tables and a chart, for the view permission.

Live counts by kind and queue, queue latency, kinds nobody serves (orphans),
the journal's last hour by kind and per minute as an SVG chart, the history
of the roll-ups over a range as charts (`history_pages`), the live workers,
and the pauses (`pauses`). Kind names link to their page (`kind_page`).
`JobAdmin.stats_view` checks the permission and calls `stats_page`;
`?refresh=10` reloads the page every 10 seconds.
"""

from __future__ import annotations

import reprlib
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone

from django_venturi.admin import history_pages
from django_venturi.admin import pauses as pause_admin
from django_venturi.admin.breadcrumbs import job_page_breadcrumbs
from django_venturi.admin.display import short_age
from django_venturi.conf import venturi_settings
from django_venturi.models import Job, JournalEntry
from django_venturi.observe.snapshot import Stats, stats
from django_venturi.observe.table_health import table_health
from django_venturi.store import registration, tallies

CHART_BAR_WIDTH = 10
CHART_HEIGHT = 120
MIN_REFRESH_SECONDS = 2
MAX_REFRESH_SECONDS = 86_400
"""`?refresh=` past a day is refused: the page would never reload in practice."""


def stats_page(model_admin: admin.ModelAdmin[Job], request: HttpRequest) -> TemplateResponse:
    """The page, from one snapshot (the caller checked the permission)."""
    snapshot = stats(using=venturi_settings.DATABASE)
    request.current_app = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Queue stats",
        "breadcrumbs": job_page_breadcrumbs(model_admin, request, "Queue stats"),
        "opts": model_admin.model._meta,
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
        "table_health": table_health(using=venturi_settings.DATABASE),
        **pause_admin.pause_context(request, snapshot),
        **history_pages.history_context(request),
    }
    return TemplateResponse(request, "admin/django_venturi/job/stats.html", context)


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
    """`?refresh=10` reloads the stats page every 10 s (at least 2 s; none by default or 0).

    Anything but a whole number of seconds up to `MAX_REFRESH_SECONDS` in ASCII
    digits ("²", "1.5", 5,000 digits) is refused with a message; the page then
    does not reload itself.
    """
    value = request.GET.get("refresh", "").strip()
    if not value:
        return None
    limit = str(MAX_REFRESH_SECONDS)
    if value.isascii() and value.isdigit() and len(value.lstrip("0")) <= len(limit):
        seconds = int(value)
        if seconds <= MAX_REFRESH_SECONDS:
            return max(seconds, MIN_REFRESH_SECONDS) if seconds else None
    messages.warning(
        request,
        f"refresh: expected a whole number of seconds from 0 to {limit}, got "
        f"{reprlib.repr(value)}; the page does not reload itself.",
        fail_silently=True,
    )
    return None


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
