"""The latest errors grouped by exception type and first line, with counts and a link.

`error_groups(kind=None)` reads the jobs whose error is current (failed, or
ready again after a failed run: `filters.CURRENT_ERROR`), for one kind or all,
and groups them by `Job.error_type` and the first line of the message. Each
group links to the job list filtered by that type (and kind), where "Retry all
in this filter" and "Cancel all in this filter" act on them.

It stays cheap on a table of millions: the types come from the error type
index by a loose scan (`filters.error_types`), and each type's newest jobs are
read from that index, at most `PER_TYPE` of them; a type with more says so
(`ErrorGroup.more`). The job list shows the groups above its rows when it is
filtered to jobs with an error; a per-kind page calls it with `kind=`.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from urllib.parse import urlencode

from django.http import HttpRequest
from django.urls import reverse

from django_venturi.admin.display import cut_between_words
from django_venturi.admin.filters import TYPED_CURRENT_ERROR, error_types
from django_venturi.admin.masking import job_mask
from django_venturi.conf import venturi_settings
from django_venturi.models import Job
from django_venturi.store.error_types import short_name
from django_venturi.store.verdicts import GAVE_UP_SEPARATOR

PER_TYPE = 200
"""The newest jobs read of each error type."""
FIRST_LINE_SHOWN = 120
"""A group's first line is cut between words past this many characters."""


@dataclasses.dataclass(frozen=True)
class ErrorGroup:
    """Jobs whose current error has one type and one first line."""

    error_type: str
    """`module.Name`, as stored."""
    first_line: str
    """The message's first line (cut between words, secret values masked)."""
    count: int
    """Jobs of the group among the newest `PER_TYPE` of its type."""
    more: bool
    """Whether the type has more jobs than were read: `count` is then a lower bound."""
    latest_job: int
    """The newest job of the group."""
    latest_at: datetime | None
    """When the newest job of the group last ran."""
    url: str
    """The job list, filtered to the jobs of this type (and kind)."""

    @property
    def name(self) -> str:
        return short_name(self.error_type)


def error_groups(kind: str | None = None, *, using: str | None = None) -> list[ErrorGroup]:
    """The current errors of `kind` (or every kind), grouped; the largest group first."""
    alias = using or venturi_settings.DATABASE
    groups: list[ErrorGroup] = []
    for error_type in error_types(alias):
        groups.extend(_groups_of_type(alias, error_type, kind))
    return sorted(groups, key=lambda group: (-group.count, -group.latest_job))


def _groups_of_type(alias: str, error_type: str, kind: str | None) -> list[ErrorGroup]:
    jobs = Job.objects.using(alias).filter(TYPED_CURRENT_ERROR, error_type=error_type)
    if kind is not None:
        jobs = jobs.filter(kind=kind)
    rows = list(jobs.order_by("-id")[:PER_TYPE])
    by_line: dict[str, list[Job]] = {}
    for job in rows:
        by_line.setdefault(first_line(job), []).append(job)
    url = job_list_url(error_type, kind)
    return [
        ErrorGroup(
            error_type=error_type,
            first_line=line,
            count=len(members),
            more=len(rows) == PER_TYPE,
            latest_job=members[0].pk,
            latest_at=members[0].started_at,
            url=url,
        )
        for line, members in by_line.items()
    ]


def first_line(job: Job) -> str:
    """The first line of a job's error message, after its type and any give-up note."""
    message = job_mask(job).text(job.last_error).partition(": ")[2]
    message = message.partition(GAVE_UP_SEPARATOR)[2] or message
    return cut_between_words(message.strip().partition("\n")[0], FIRST_LINE_SHOWN)


def job_list_url(error_type: str, kind: str | None = None) -> str:
    """The job list filtered to the jobs whose current error has this type (and kind)."""
    query = {"error_type": error_type, **({"kind": kind} if kind is not None else {})}
    return f"{reverse('admin:django_venturi_job_changelist')}?{urlencode(query)}"


def error_groups_of_list(request: HttpRequest) -> list[ErrorGroup] | None:
    """The groups the job list shows above its rows: when it lists jobs with an error
    (`?has_error=yes`), of its kind if it has one; None otherwise (nothing is read)."""
    if request.GET.get("has_error") != "yes":
        return None
    return error_groups(request.GET.get("kind") or None)
