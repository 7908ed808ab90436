"""Maintenance run by workers on the schedule of `VENTURI["MAINTENANCE"]` (PostgreSQL).

Every worker runs a maintainer thread when the setting is given, but one run
happens per interval between them all: each pass takes the maintenance turn
(`store/maintenance_lock.py`: never beside another maintenance run nor a cleanup)
and reads the task's latest start in `MaintenanceRun` before doing anything
(`store/maintenance.py`). Off PostgreSQL the thread is not started.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.db import connections

from django_venturi.conf import venturi_settings
from django_venturi.store.maintenance import Outcome, run_reindex
from django_venturi.worker.chores import PeriodicChore

logger = logging.getLogger("django_venturi.maintenance")

PASS_INTERVAL = timedelta(minutes=10)
"""How often each worker offers to run what is due."""
FIRST_PASS_AFTER = timedelta(seconds=30)


def maintain(alias: str) -> Outcome | None:
    """Run the reindex if `MAINTENANCE` asks for it and it is due; None if not configured."""
    every = venturi_settings.MAINTENANCE.get("REINDEX")
    if every is None:
        return None
    outcome = run_reindex(alias, every=every)
    if outcome.report is not None:
        logger.info(
            "maintenance: reindex done: %s",
            "; ".join(outcome.report.lines()) or "no index",
            extra={"rebuilt": len(outcome.report.rebuilt), "dropped": len(outcome.report.dropped)},
        )
    return outcome


class Maintainer(PeriodicChore):
    """A daemon thread of a worker that offers to maintain every `interval` until `stop`."""

    thread_name = "venturi-maintenance"
    first_after = FIRST_PASS_AFTER
    logger = logger
    failure = "maintenance failed: %s; next pass in %s"

    def __init__(
        self, *, alias: str, stop: threading.Event, interval: timedelta = PASS_INTERVAL
    ) -> None:
        super().__init__(alias=alias, stop=stop, interval=interval)

    @classmethod
    def start_if_configured(cls, *, alias: str, stop: threading.Event) -> Maintainer | None:
        if not venturi_settings.MAINTENANCE or connections[alias].vendor != "postgresql":
            return None
        chore = cls(alias=alias, stop=stop)
        chore.thread.start()
        return chore

    def run_pass(self) -> object:
        return maintain(self.alias)
