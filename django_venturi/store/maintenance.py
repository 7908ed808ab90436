"""A maintenance run: its turn (`maintenance_lock.py`), its record (`MaintenanceRun`), its work.

`run_reindex` is what `manage.py venturi_maintenance reindex` and the workers'
schedule (`worker/maintainer.py`) call: it takes the maintenance turn or returns
`Busy` at once, and with `every` it first reads the task's latest start, so that
one run happens per interval between all the workers of a database.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from datetime import timedelta

from django.db.models.functions import Now

from django_venturi.store.clock import database_time
from django_venturi.store.maintenance_lock import maintenance_turn
from django_venturi.store.reindex import ReindexReport, refuse_unless_possible, reindex

REINDEX = "reindex"
"""The task name of the reindex in `MaintenanceRun` (and `VENTURI["MAINTENANCE"]["REINDEX"]`)."""


class Skipped(enum.Enum):
    """Why a maintenance run did not happen."""

    BUSY = "another maintenance run or a cleanup holds the turn"
    NOT_DUE = "the latest run is more recent than the interval"


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """A maintenance run's report, or why it did not run."""

    report: ReindexReport | None
    skipped: Skipped | None = None


def run_reindex(
    alias: str,
    *,
    every: timedelta | None = None,
    dry_run: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """Run `reindex()` on `alias` in the maintenance turn, recorded in `MaintenanceRun`.

    With `every`, only if the latest reindex began at least that long ago.
    Raises `MaintenanceRefused` off PostgreSQL or inside a transaction.
    """
    refuse_unless_possible(alias)
    with maintenance_turn(alias) as taken:
        if not taken:
            return Outcome(None, Skipped.BUSY)
        if dry_run:
            return Outcome(reindex(alias, dry_run=True))
        if every is not None and not _due(alias, every):
            return Outcome(None, Skipped.NOT_DUE)
        return Outcome(_recorded(alias, progress))


def _due(alias: str, every: timedelta) -> bool:
    from django_venturi.models import MaintenanceRun

    latest = MaintenanceRun.objects.using(alias).filter(task=REINDEX).first()
    return latest is None or database_time(alias) - latest.started_at >= every


def _recorded(alias: str, progress: Callable[[str], None] | None) -> ReindexReport:
    from django_venturi.models import MaintenanceRun

    runs = MaintenanceRun.objects.using(alias)
    runs.update_or_create(
        task=REINDEX, defaults={"started_at": Now(), "finished_at": None, "report": ""}
    )
    try:
        report = reindex(alias, progress=progress)
    except Exception as error:
        runs.filter(task=REINDEX).update(report=f"failed: {error}")
        raise
    runs.filter(task=REINDEX).update(finished_at=Now(), report="\n".join(report.lines()))
    return report
