"""What the stats show of rate limits: each limit, its use now, and the jobs waiting on it."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from django_venturi.registry import registry
from django_venturi.states import State


@dataclasses.dataclass(frozen=True, slots=True)
class RateLimitUse:
    """A rate-limited kind as the stats show it."""

    kind: str
    limit: str
    """What the limit says: `50 per 1s`, `5 per 1s per account_id`."""
    used: int
    """Starts its window counts now (all keys together)."""
    busiest: int
    """The most starts of one key in the window (the kind's own for an unkeyed limit)."""
    keys_at_limit: int
    """Keys (or the kind itself) with no room left now."""
    waiting: int
    """Due ready jobs of the kind."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def usage(alias: str, now: datetime) -> list[RateLimitUse]:
    """Each rate limit this process knows (its registry), its use now, and its due jobs."""
    from django_venturi.models import Job, RateStart  # at call time: stats load models late

    limited = {spec.kind: spec.rate_limit for spec in registry.specs() if spec.rate_limit}
    if not limited:
        return []
    waiting = dict(
        Job.objects.using(alias)
        .filter(state=State.READY, run_at__lte=now, kind__in=list(limited))
        .values_list("kind")
        .annotate(jobs=Count("id"))
        .values_list("kind", "jobs")
        .order_by()
    )
    rows = []
    for kind, limit in sorted(limited.items()):
        since = now - timedelta(seconds=limit.window_seconds)
        per_key = list(
            RateStart.objects.using(alias)
            .filter(kind=kind, started_at__gt=since)
            .values_list("key")
            .annotate(starts=Count("id"))
            .values_list("starts", flat=True)
            .order_by()
        )
        rows.append(
            RateLimitUse(
                kind=kind,
                limit=limit.describe(),
                used=sum(per_key),
                busiest=max(per_key, default=0),
                keys_at_limit=sum(1 for starts in per_key if starts >= limit.limit),
                waiting=waiting.get(kind, 0),
            )
        )
    return rows
