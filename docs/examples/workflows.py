"""Workflows: jobs after jobs, chains, groups with a callback, results, atomic handlers."""

from __future__ import annotations

import dataclasses

from django.contrib.auth.models import Group, User

import django_venturi as venturi
from django_venturi.models import Job


# [chain tasks]
@venturi.task(kind="docs.fetch_page")
@dataclasses.dataclass
class FetchPage(venturi.Task):
    url: str

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        html = f"<h1>{self.url}</h1>"  # fetch it for real here
        return venturi.Outcome.completed(result={"url": self.url, "length": len(html)})


@venturi.task(kind="docs.index_page")
@dataclasses.dataclass
class IndexPage(venturi.Task):
    url: str

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        (fetched,) = ctx.dependency_results().values()  # {job_id: result} of FetchPage
        return venturi.Outcome.completed(result={"indexed": fetched["length"]})


# [chain tasks end]


# [after]
def crawl(url: str) -> tuple[Job, Job]:
    fetch = FetchPage(url=url).enqueue()
    index = IndexPage(url=url).enqueue(after=[fetch])  # `waiting` until fetch completes
    return fetch, index


# [after end]


# [chain]
def crawl_chained(url: str) -> list[Job]:
    return venturi.chain(FetchPage(url=url), IndexPage(url=url)).enqueue()


# [chain end]


# [group]
@venturi.task(kind="docs.count_members")
@dataclasses.dataclass
class CountMembers(venturi.Task):
    group_id: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        members = User.objects.filter(groups__id=self.group_id).count()
        return venturi.Outcome.completed(result=members)


@venturi.task(kind="docs.report_members")
@dataclasses.dataclass
class ReportMembers(venturi.Task):
    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        total = sum(ctx.dependency_results().values())  # runs once, after every count
        return venturi.Outcome.completed(result={"total": total})


def report_all_groups() -> tuple[list[Job], Job]:
    counts = [CountMembers(group_id=group.pk) for group in Group.objects.order_by("pk")]
    return venturi.group(counts, then=ReportMembers()).enqueue()


# [group end]


# [atomic]
@venturi.task(kind="docs.open_team", atomic=True)
@dataclasses.dataclass
class OpenTeam(venturi.Task):
    name: str
    owner_id: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        # Committed together with this job's `completed`, or not at all: a run that
        # raises, or that lost its claim to another worker, rolls both writes back.
        team = Group.objects.create(name=self.name)
        User.objects.get(pk=self.owner_id).groups.add(team)
        return venturi.Outcome.completed(result=team.pk)


# [atomic end]
