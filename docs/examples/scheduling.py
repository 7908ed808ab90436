"""Scheduling: queues, priorities, delays and a global concurrency cap."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import django_venturi as venturi
from django_venturi.models import Job


# [capped]
@venturi.task(
    kind="docs.render_report",
    queue="reports",  # served by `venturi_worker --queues reports`
    priority=venturi.Priority.LOW,  # HIGH and NORMAL jobs go first, LOW is never starved
    concurrency=2,  # at most two running at once, across every worker on every host
)
@dataclasses.dataclass
class RenderReport(venturi.Task):
    report_id: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


# [capped end]


# [schedule]
def schedule_reports(report_ids: list[int]) -> list[Job]:
    urgent, *rest = report_ids
    jobs = [RenderReport(report_id=urgent).enqueue(priority=venturi.Priority.HIGH)]
    jobs += [
        RenderReport(report_id=report_id).enqueue(delay=timedelta(minutes=30)) for report_id in rest
    ]
    return jobs


# [schedule end]
