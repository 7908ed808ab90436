"""The periodic scheduler: each worker's pass over the schedules, every `PERIODIC_INTERVAL`.

For each schedule, the latest tick at or before the database's `now()` is
enqueued if it is later than the kind's recorded tick (`store/periodic_ticks.py`
decides, in the database). A tick that does not run is recorded as skipped: a
tick of a disabled schedule, and a missed one that its schedule's catch-up
refuses (`Schedule.catch_up_allows`: from before the schedule was first seen, or
missed by more than `PERIODIC_CATCH_UP`). The claim loop runs the passes
(`claimer.py`).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django_venturi.conf import venturi_settings
from django_venturi.enqueue import prepare
from django_venturi.periodic import Schedule, ScheduleError, schedules
from django_venturi.registry import UnknownKind
from django_venturi.store.clock import database_time
from django_venturi.store.connections import DATABASE_ERRORS
from django_venturi.store.periodic_ticks import enqueue_tick, skip_tick
from django_venturi.store.schedule_states import seen

logger = logging.getLogger("django_venturi.periodic")


class Scheduler:
    """A worker's scheduler passes: enqueue the latest tick of each schedule, once.

    The database decides (`PeriodicTick`, one row per kind); what this process
    remembers only saves it a statement for a tick it already handled.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._handled: dict[str, datetime] = {}
        """The latest tick of each kind this process saw handled (enqueued or skipped)."""

    @property
    def interval(self) -> float:
        return venturi_settings.PERIODIC_INTERVAL.total_seconds()

    def run_pass(self, now: datetime | None = None) -> list[int]:
        """Enqueue the ticks that came due; return the ids of the jobs this pass created."""
        try:
            found = schedules()
        except ScheduleError as error:
            logger.error("periodic schedules are invalid, none runs: %s", error)
            return []
        if not found:
            return []
        now = now or database_time(self.alias)
        created: list[int] = []
        failed: list[Exception] = []
        for schedule in found:
            tick = schedule.latest_tick(now)
            if tick is None:
                continue
            # As an instant: the two passes of a repeated hour have the same clock time,
            # and datetimes of one zone compare (and subtract) by clock time.
            instant = tick.astimezone(UTC)
            if self._handled.get(schedule.kind) == instant:
                continue
            try:
                job_id = self._handle(schedule, tick, now)
            except (UnknownKind, TypeError, ValueError) as error:
                # A bad schedule must not stop the worker: `manage.py check` names it.
                self._handled[schedule.kind] = instant
                logger.error("periodic %s (%s): %s", schedule.kind, schedule.origin, error)
                continue
            except Exception as error:
                # The database refused the insert (a lock, a deadlock, a lost connection,
                # a trigger): the tick stays unhandled, the next pass tries it again, and
                # the other schedules go on.
                logger.warning(
                    "periodic %s: enqueueing tick %s failed (%s: %s); trying again next pass",
                    schedule.kind,
                    tick.isoformat(),
                    type(error).__name__,
                    error,
                    extra={"kind": schedule.kind},
                )
                failed.append(error)
                continue
            self._handled[schedule.kind] = instant
            if job_id is not None:
                created.append(job_id)
        if failed and isinstance(failed[-1], DATABASE_ERRORS):
            raise failed[-1]  # the caller learns of a lost database and waits it out
        return created

    def _handle(self, schedule: Schedule, tick: datetime, now: datetime) -> int | None:
        """Enqueue the tick, or record it skipped (its schedule is disabled, or its
        catch-up refuses it); return the id of the job this created, if it did."""
        instant = tick.astimezone(UTC)
        state = seen(self.alias, schedule.kind, now)
        if not state.enabled:
            self._skip(schedule, tick, "the schedule is disabled")
            return None
        if not schedule.catch_up_allows(instant, now, state.first_seen_at):
            self._skip(schedule, tick, "missed, and its catch-up does not run it")
            return None
        new = prepare(schedule.instance(), delay=None, run_at=None, priority=None, queue=None)
        job_id = enqueue_tick(self.alias, new, instant)
        if job_id is not None:
            logger.info(
                "periodic %s: enqueued job %d for tick %s",
                schedule.kind,
                job_id,
                tick.isoformat(),
                extra={"kind": schedule.kind, "job_id": job_id},
            )
        return job_id

    def _skip(self, schedule: Schedule, tick: datetime, why: str) -> None:
        if skip_tick(self.alias, schedule.kind, tick.astimezone(UTC)):
            logger.info(
                "periodic %s: tick %s skipped: %s",
                schedule.kind,
                tick.isoformat(),
                why,
                extra={"kind": schedule.kind},
            )
