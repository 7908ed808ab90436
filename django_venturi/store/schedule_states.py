"""Each periodic schedule's state in the database: enabled or not, and when it was first seen.

One `ScheduleState` row per kind, written the first time a worker's scheduler
pass (or the admin) meets the schedule and never deleted: a schedule removed
from code or settings and added back finds its row, disabled if it was. Workers
read it before enqueueing a tick (`worker/scheduler.py`); the admin's periodic
page disables and enables (`admin/schedule_actions.py`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django_venturi.store.clock import database_time

if TYPE_CHECKING:
    from django_venturi.models import ScheduleState


def seen(alias: str, kind: str, now: datetime | None = None) -> ScheduleState:
    """The kind's state, recorded as first seen at `now` (default: the database's time)
    if no one recorded it before.

    Several workers may meet a new schedule at once: the first insert wins
    (`ON CONFLICT DO NOTHING`) and every one reads the winner's row. A kind that
    already has a recorded tick (handled by a version without this table) was
    seen at that tick at the latest, so its missed ticks are caught up as before.
    """
    from django_venturi.models import PeriodicTick, ScheduleState

    states = ScheduleState.objects.using(alias)
    state = states.filter(kind=kind).first()
    if state is not None:
        return state
    recorded = PeriodicTick.objects.using(alias).filter(kind=kind).first()
    now = now or database_time(alias)
    first_seen = min(recorded.tick, now) if recorded is not None else now
    states.bulk_create([ScheduleState(kind=kind, first_seen_at=first_seen)], ignore_conflicts=True)
    return states.get(kind=kind)


def set_enabled(alias: str, kind: str, *, enabled: bool, by: str) -> bool:
    """Enable or disable the kind's schedule, naming who did; False if it was so already."""
    from django_venturi.models import ScheduleState

    seen(alias, kind)
    changed = (
        ScheduleState.objects.using(alias)
        .filter(kind=kind)
        .exclude(enabled=enabled)
        .update(enabled=enabled, changed_by=by, changed_at=database_time(alias))
    )
    return changed > 0
