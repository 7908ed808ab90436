"""Scheduling: queues, priorities, delays, fair queues and accounts, a global concurrency cap
and a cap per account."""

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


# [capped per key]
@venturi.task(
    kind="docs.sync_account",
    # The CRM takes two calls at once per account: each account_id gets its own two,
    # across every worker on every host; other accounts are not held up behind it.
    concurrency=venturi.Concurrency(2, key="account_id"),
)
@dataclasses.dataclass
class SyncAccount(venturi.Task):
    account_id: str
    page: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


# [capped per key end]


# [schedule]
def schedule_reports(report_ids: list[int]) -> list[Job]:
    urgent, *rest = report_ids
    jobs = [RenderReport(report_id=urgent).enqueue(priority=venturi.Priority.HIGH)]
    jobs += [
        RenderReport(report_id=report_id).enqueue(delay=timedelta(minutes=30)) for report_id in rest
    ]
    return jobs


# [schedule end]


# [fair queues]
@venturi.task(kind="docs.import_row", queue="imports")
@dataclasses.dataclass
class ImportRow(venturi.Task):
    row: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


def import_spreadsheet(rows: int) -> list[Job]:
    """A big import: its jobs queue up in `imports`, where they cannot hold back the
    jobs of other queues (the workers give each queue with due jobs its turns)."""
    return venturi.enqueue_many([ImportRow(row=row) for row in range(rows)])


# settings.py: four receipts for each import row while both queues have due jobs
FAIR_QUEUES = {"QUEUE_WEIGHTS": {"imports": 1, "emails": 4}}
# [fair queues end]


# [fair by account]
@venturi.task(kind="docs.import_contact", fair_by="account_id")
@dataclasses.dataclass
class ImportContact(venturi.Task):
    """One contact of an account's import: accounts take turns, so one account's big
    import does not hold back another account's small one."""

    account_id: str
    row: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


def import_contacts(account_id: str, rows: int) -> list[Job]:
    return venturi.enqueue_many(
        [ImportContact(account_id=account_id, row=row) for row in range(rows)]
    )


# [fair by account end]
