"""What the stats show of fair kinds (`fair_by=`): how many keys have due jobs, and the
keys with the most of them (the backlogs the others take turns with)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django.db.models import Count

from django_venturi.registry import registry
from django_venturi.states import State

BUSIEST = 5
"""The most keys a fair kind's `busiest` lists."""


@dataclasses.dataclass(frozen=True, slots=True)
class FairUse:
    """A fair kind as the stats show it."""

    kind: str
    fair_by: str
    """The payload field whose values take turns."""
    keys_with_due: int
    """Keys with due ready jobs."""
    busiest: list[tuple[str, int]]
    """Up to 5 keys with the most due jobs, as (key, due jobs), most first, then by key."""
    waiting: int
    """Due ready jobs of the kind."""

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["busiest"] = [[key, due] for key, due in self.busiest]
        return data


def usage(alias: str, now: datetime) -> list[FairUse]:
    """Each fair kind this process knows (its registry) and its due jobs by key, counted
    by the database (one grouped count per fair kind, read from the fair index)."""
    from django_venturi.models import Job  # at call time: stats load models late

    fair = {spec.kind: spec.fair_by for spec in registry.specs() if spec.fair_by}
    uses = []
    for kind, field in sorted(fair.items()):
        due = Job.objects.using(alias).filter(
            state=State.READY, run_at__lte=now, kind=kind, fair_key__isnull=False
        )
        per_key = list(
            due.values_list("fair_key").annotate(jobs=Count("id")).values_list("fair_key", "jobs")
        )
        busiest = sorted(
            ((key or "", jobs) for key, jobs in per_key), key=lambda item: (-item[1], item[0])
        )
        uses.append(
            FairUse(
                kind=kind,
                fair_by=field,
                keys_with_due=len(per_key),
                busiest=busiest[:BUSIEST],
                waiting=sum(jobs for _, jobs in per_key),
            )
        )
    return uses
