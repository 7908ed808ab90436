"""The admin's "Periodic tasks" page: each schedule with its next tick and its last run.

The last run is the kind's `PeriodicTick` (the latest tick handled and when),
which outlives the tick's job: after a cleanup the page still shows it, without
the link to the job.

The schedules live in code (`@venturi.periodic`) and settings (`VENTURI["PERIODIC"]`),
not in a table, so this is a read-only page over them, registered on a proxy model
of `Job` so that it sits in the admin index next to jobs.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from django_venturi.admin.breadcrumbs import model_list_breadcrumbs
from django_venturi.conf import venturi_settings
from django_venturi.models import Job, PeriodicTask, PeriodicTick
from django_venturi.periodic import Schedule, schedules
from django_venturi.store.clock import database_time

if TYPE_CHECKING:
    PeriodicTaskAdminBase = admin.ModelAdmin[PeriodicTask]
else:
    PeriodicTaskAdminBase = admin.ModelAdmin


@dataclasses.dataclass(frozen=True)
class ScheduleRow:
    """One line of the page."""

    schedule: Schedule
    next_tick: datetime | None
    last_tick: PeriodicTick | None
    """The latest tick handled (enqueued or skipped); None if none yet."""
    last_job: Job | None
    """The latest tick's job, while it exists."""
    last_job_url: str

    @property
    def next_text(self) -> str:
        return local_text(self.next_tick, self.schedule)

    @property
    def last_text(self) -> str:
        return local_text(self.last_tick.tick if self.last_tick else None, self.schedule)

    @property
    def handled_text(self) -> str:
        """When the latest tick was enqueued or skipped."""
        return local_text(self.last_tick.handled_at if self.last_tick else None, self.schedule)


def local_text(moment: datetime | None, schedule: Schedule) -> str:
    """A tick in its schedule's own time zone, as cron reads it."""
    if moment is None:
        return "-"
    return moment.astimezone(schedule.zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def schedule_rows(alias: str) -> list[ScheduleRow]:
    """Each schedule with its next tick and its latest handled tick (with the job, if kept)."""
    now = database_time(alias)
    found = schedules()
    ticks = PeriodicTick.objects.using(alias).in_bulk([schedule.kind for schedule in found])
    job_ids = [tick.job_id for tick in ticks.values() if tick.job_id is not None]
    jobs = Job.objects.using(alias).in_bulk(job_ids)
    rows = []
    for schedule in found:
        last_tick = ticks.get(schedule.kind)
        last_job = jobs.get(last_tick.job_id) if last_tick and last_tick.job_id else None
        rows.append(
            ScheduleRow(
                schedule=schedule,
                next_tick=schedule.next_tick(now),
                last_tick=last_tick,
                last_job=last_job,
                last_job_url=(
                    reverse("admin:django_venturi_job_change", args=[last_job.pk])
                    if last_job
                    else ""
                ),
            )
        )
    return rows


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(PeriodicTaskAdminBase):
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        request.current_app = self.admin_site.name
        context = {
            **self.admin_site.each_context(request),
            "title": "Periodic tasks",
            "breadcrumbs": model_list_breadcrumbs(self, request),
            "opts": self.model._meta,
            "rows": schedule_rows(venturi_settings.DATABASE),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_venturi/periodic_tasks.html", context)

    def get_urls(self) -> list[URLPattern]:
        """The list of schedules only.

        The proxy model's rows are jobs: Django's change, history and delete views
        would show any job (its payload unmasked) to whoever may view periodic tasks.
        A schedule's last job links to the job admin, which checks and masks.
        """
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="django_venturi_periodictask_changelist",
            )
        ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: PeriodicTask | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: PeriodicTask | None = None) -> bool:
        return False
