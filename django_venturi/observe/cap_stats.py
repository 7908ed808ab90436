"""What the stats show of concurrency caps: each cap, the jobs holding its places, and
the due jobs waiting on it.

Running jobs are few (they run), so their payloads are read and their keys counted
as the claim counts them (`field_text`). Due jobs can be many: their keys are counted
by the database, one row per capped kind, so the cost does not follow the backlog
into Python.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime
from typing import Any

from django.db.models import Count
from django.db.models.lookups import In

from django_venturi.registry import registry
from django_venturi.states import State
from django_venturi.store.concurrency import Concurrency, field_text, payload_key

BUSIEST = 5
"""The most keys a keyed cap's `busiest` lists."""


@dataclasses.dataclass(frozen=True, slots=True)
class CapUse:
    """A capped kind as the stats show it."""

    kind: str
    cap: str
    """What the cap says: `2`, `2 per account_id`."""
    key: str | None
    """The payload field whose values are capped apart; None: the kind is capped whole."""
    running: int
    """Running jobs of the kind (all keys together): the places held."""
    keys_with_due: int
    """Keys with due ready jobs (an unkeyed cap: 1 if any job is due, else 0)."""
    keys_at_cap: int
    """Keys whose running jobs fill their cap (an unkeyed cap: 1 if the kind is at it)."""
    busiest: list[tuple[str, int]]
    """Up to 5 keys with the most running jobs, as (key, running), most first, then by
    key (an unkeyed cap: none)."""
    waiting: int
    """Due ready jobs of the kind."""
    waiting_on_cap: int
    """Due ready jobs whose key (or kind, unkeyed) is at its cap: no claim takes them now."""

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["busiest"] = [[key, running] for key, running in self.busiest]
        return data


def usage(alias: str, now: datetime) -> list[CapUse]:
    """Each concurrency cap this process knows (its registry), its places held now, and
    its due jobs."""
    from django_venturi.models import Job  # at call time: stats load models late

    capped = {spec.kind: spec.concurrency for spec in registry.specs() if spec.concurrency}
    if not capped:
        return []
    keyed = [kind for kind, cap in capped.items() if cap.key is not None]
    unkeyed = [kind for kind, cap in capped.items() if cap.key is None]
    jobs = Job.objects.using(alias)
    waiting = dict(
        jobs.filter(state=State.READY, run_at__lte=now, kind__in=list(capped))
        .values_list("kind")
        .annotate(jobs=Count("id"))
        .values_list("kind", "jobs")
        .order_by()
    )
    running: dict[str, int] = {}
    if unkeyed:
        running = dict(
            jobs.filter(state=State.RUNNING, kind__in=unkeyed)
            .values_list("kind")
            .annotate(jobs=Count("id"))
            .values_list("kind", "jobs")
            .order_by()
        )
    held: dict[str, Counter[str]] = {kind: Counter() for kind in keyed}
    if keyed:
        for kind, payload in jobs.filter(state=State.RUNNING, kind__in=keyed).values_list(
            "kind", "payload"
        ):
            held[kind][field_text(capped[kind].key, payload)] += 1
    return [
        _whole(kind, cap, running.get(kind, 0), waiting.get(kind, 0))
        if cap.key is None
        else _keyed(alias, now, kind, cap, cap.key, held[kind], waiting.get(kind, 0))
        for kind, cap in sorted(capped.items())
    ]


def _whole(kind: str, cap: Concurrency, running: int, due: int) -> CapUse:
    """A cap on the whole kind: one "key", at its cap or not."""
    at_cap = running >= cap.limit
    return CapUse(
        kind=kind,
        cap=cap.describe(),
        key=None,
        running=running,
        keys_with_due=1 if due else 0,
        keys_at_cap=1 if at_cap else 0,
        busiest=[],
        waiting=due,
        waiting_on_cap=due if at_cap else 0,
    )


def _keyed(
    alias: str,
    now: datetime,
    kind: str,
    cap: Concurrency,
    field: str,
    held: Counter[str],
    due: int,
) -> CapUse:
    """A cap per key: its running jobs by key (read), its due jobs' keys (counted in SQL)."""
    full = sorted(key for key, running in held.items() if running >= cap.limit)
    keys_with_due, on_cap = _due_keys(alias, now, kind, field, full) if due else (0, 0)
    return CapUse(
        kind=kind,
        cap=cap.describe(),
        key=field,
        running=sum(held.values()),
        keys_with_due=keys_with_due,
        keys_at_cap=len(full),
        busiest=sorted(held.items(), key=lambda item: (-item[1], item[0]))[:BUSIEST],
        waiting=due,
        waiting_on_cap=on_cap,
    )


def _due_keys(alias: str, now: datetime, kind: str, field: str, full: list[str]) -> tuple[int, int]:
    """Distinct keys among the due jobs of `kind`, and its due jobs whose key is `full`:
    one aggregate row, whatever the number of keys or jobs."""
    from django_venturi.models import Job

    key = payload_key(alias, field)
    figures: dict[str, Any] = {"keys": Count(key, distinct=True)}
    if full:  # `IN` of nothing is no SQL
        figures["on_cap"] = Count("id", filter=In(key, full))
    found = (
        Job.objects.using(alias)
        .filter(state=State.READY, run_at__lte=now, kind=kind)
        .aggregate(**figures)
    )
    return found["keys"], found.get("on_cap", 0)
