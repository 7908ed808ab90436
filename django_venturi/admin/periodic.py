"""The admin's "Periodic tasks" page: each schedule with its next runs, its last run and its state.

The next five runs are shown in the site's time zone (the active one, Django's
`TIME_ZONE` by default). The last run is the kind's `PeriodicTick` (the latest
tick handled and when), which outlives the tick's job: after a cleanup the page
still shows it, without the link to the job. Whether the schedule is enabled is
its `ScheduleState` row; run now, disable and enable are `schedule_actions.py`.

The schedules live in code (`@venturi.periodic`) and settings (`VENTURI["PERIODIC"]`),
not in a table, so this page lists them, registered on a proxy model of `Job` so
that it sits in the admin index next to jobs.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from django_venturi.admin import schedule_actions
from django_venturi.admin.breadcrumbs import model_list_breadcrumbs
from django_venturi.conf import venturi_settings
from django_venturi.models import Job, PeriodicTask, PeriodicTick, ScheduleState
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
    next_ticks: list[datetime]
    """The next five ticks."""
    state: ScheduleState | None
    """Whether it is enabled and who changed that; None until a worker or the admin saw it."""
    last_tick: PeriodicTick | None
    """The latest tick handled (enqueued or skipped); None if none yet."""
    last_job: Job | None
    """The latest tick's job, while it exists."""
    last_job_url: str

    @property
    def enabled(self) -> bool:
        return self.state is None or self.state.enabled

    @property
    def buttons(self) -> list[tuple[str, str]]:
        """Run now, and disable or enable, whichever applies: (label, confirmation page URL)."""
        toggle = schedule_actions.DISABLE if self.enabled else schedule_actions.ENABLE
        return [
            (action.label, schedule_actions.action_url(action, self.schedule.kind))
            for action in (schedule_actions.RUN_NOW, toggle)
        ]

    @property
    def next_texts(self) -> list[str]:
        return [local_text(tick) for tick in self.next_ticks]

    @property
    def last_text(self) -> str:
        return local_text(self.last_tick.tick if self.last_tick else None)

    @property
    def handled_text(self) -> str:
        """When the latest tick was enqueued or skipped."""
        return local_text(self.last_tick.handled_at if self.last_tick else None)

    @property
    def changed_text(self) -> str:
        """When the schedule was last disabled or enabled."""
        return local_text(self.state.changed_at if self.state else None)


NEXT_RUNS = 5
"""How many of its next ticks the page shows for each schedule."""


def local_text(moment: datetime | None) -> str:
    """A moment in the site's (the active) time zone."""
    if moment is None:
        return "-"
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")


def schedule_rows(alias: str) -> list[ScheduleRow]:
    """Each schedule with its next tick and its latest handled tick (with the job, if kept)."""
    now = database_time(alias)
    found = schedules()
    kinds = [schedule.kind for schedule in found]
    ticks = PeriodicTick.objects.using(alias).in_bulk(kinds)
    states = ScheduleState.objects.using(alias).in_bulk(kinds)
    job_ids = [tick.job_id for tick in ticks.values() if tick.job_id is not None]
    jobs = Job.objects.using(alias).in_bulk(job_ids)
    rows = []
    for schedule in found:
        last_tick = ticks.get(schedule.kind)
        last_job = jobs.get(last_tick.job_id) if last_tick and last_tick.job_id else None
        rows.append(
            ScheduleRow(
                schedule=schedule,
                next_ticks=schedule.next_ticks(now, NEXT_RUNS),
                state=states.get(schedule.kind),
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
            "can_manage": schedule_actions.can_manage(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_venturi/periodic_tasks.html", context)

    def get_urls(self) -> list[URLPattern]:
        """The list of schedules and its actions only.

        The proxy model's rows are jobs: Django's change, history and delete views
        would show any job (its payload unmasked) to whoever may view periodic tasks.
        A schedule's last job links to the job admin, which checks and masks.
        """
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="django_venturi_periodictask_changelist",
            ),
            *(self.action_url(action) for action in schedule_actions.ACTIONS),
        ]

    def action_url(self, action: schedule_actions.ScheduleAction) -> URLPattern:
        def answer(request: HttpRequest, object_id: str) -> HttpResponse:
            return schedule_actions.answer(self, request, unquote(object_id), action)

        return path(
            f"<path:object_id>/{action.name}/",
            self.admin_site.admin_view(answer),
            name=f"django_venturi_periodictask_{action.name}",
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: PeriodicTask | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: PeriodicTask | None = None) -> bool:
        return False
