"""Periodic (cron) jobs: each due tick enqueued exactly once, by whichever worker gets there.

Declared on a task class with `@venturi.periodic("*/5 * * * *", timezone=...)`
(above `@venturi.task`), or in settings as `VENTURI["PERIODIC"]`. Cron
expressions are parsed by `cronsim` (five fields, or six with seconds first),
which finds the matching clock times of the schedule's time zone; which instants
those stand for across daylight-saving changes follows Debian cron's rules (see
`Schedule._tick_after`). Ticks are compared as instants, never as clock times.

This module holds the schedules; the database side of a tick is
`store/periodic_ticks.py`, and the worker's passes are `worker/scheduler.py`.
Every worker makes a scheduler pass every `PERIODIC_INTERVAL`: for each
schedule, the latest tick at or before the database's `now()` is inserted as a
job with `periodic_tick` set, if it is later than the kind's tick recorded in
`PeriodicTick`. The tick is recorded in the statement (PostgreSQL) or the
IMMEDIATE transaction (SQLite) that inserts its job, and the row outlives the
job: however many workers pass at once, and whenever cleanup deletes the job, a
tick is one job. Only the latest tick is ever considered: ticks missed while no
worker ran are not replayed; the latest missed one runs when a worker is back,
unless it is older than `PERIODIC_CATCH_UP` (then it is recorded as skipped).
A tick from before the schedule was first seen (`store/schedule_states.py`) is
skipped too, and so is each tick of a disabled schedule; a schedule's own
`catch_up` replaces both rules of lateness (`catch_up_allows`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django_venturi.conf import venturi_settings
from django_venturi.payloads.size import PayloadTooLarge, check_size
from django_venturi.registry import RegistrationError, UnknownKind, registry

CatchUp = timedelta | Literal[True] | None
"""A schedule's `catch_up`: how late a missed tick may still run (True: however late);
None: `PERIODIC_CATCH_UP`, and no tick from before the schedule was first seen."""

logger = logging.getLogger("django_venturi.periodic")

T = TypeVar("T", bound=type)


_LOOK_BACKS = [
    timedelta(minutes=1),
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=32),
    timedelta(days=367),
    timedelta(days=8 * 366),  # 29 February: 2096, then 2104
    timedelta(days=50 * 366),
]
"""How far `latest_tick` looks back, in turn, for a tick: short first, so that a
frequent schedule costs a few cronsim steps; then up to cronsim's own horizon."""

_SECOND = timedelta(seconds=1)
_DAY = timedelta(days=1)


def _naive(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None)


def _utc_offset(moment: datetime, zone: ZoneInfo) -> timedelta:
    return moment.astimezone(zone).utcoffset() or timedelta(0)


def _next_shift(low: datetime, high: datetime, zone: ZoneInfo) -> datetime | None:
    """The first instant in (low, high] (whole seconds, UTC) where the zone's UTC offset
    changes; None if it does not."""
    while low < high:
        # A zone changes its offset at most once a week: find the first week that ends
        # on another offset, then halve it down to the second.
        before, probe = _utc_offset(low, zone), min(low + timedelta(days=7), high)
        if _utc_offset(probe, zone) == before:
            low = probe
            continue
        while probe - low > _SECOND:
            middle = low + timedelta(seconds=(probe - low) // _SECOND // 2)
            if _utc_offset(middle, zone) == before:
                low = middle
            else:
                probe = middle
        return probe
    return None


def _fixed_time(cron: str) -> bool:
    """cronsim's (and Debian cron's) test for a job at fixed times, which daylight saving
    runs once: five fields, neither minute nor hour starting with `*`."""
    fields = cron.split()
    return len(fields) == 5 and not fields[0].startswith("*") and not fields[1].startswith("*")


class ScheduleError(ValueError):
    """A periodic schedule is invalid: a bad cron expression, time zone, task or payload."""


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One periodic task: which kind, on which cron expression, with which payload."""

    kind: str
    cron: str
    timezone: str | None
    """An IANA time zone name; None: Django's `TIME_ZONE`."""
    payload: dict[str, Any]
    """The task's field values (the fields not given keep their defaults)."""
    origin: str
    """Where it was declared, for error messages and the admin."""
    catch_up: CatchUp = None
    """How late a missed tick may still run, even one from before the schedule was
    first seen (True: however late); None: `PERIODIC_CATCH_UP` decides, and a tick
    from before the schedule was first seen never runs."""

    @property
    def zone(self) -> ZoneInfo:
        from django.conf import settings

        return ZoneInfo(self.timezone or settings.TIME_ZONE or "UTC")

    def latest_tick(self, now: datetime) -> datetime | None:
        """The latest tick at or before `now` (whole seconds), in the schedule's zone.

        The ticks are those of `next_tick`, compared as instants. A look-back that
        widens until it holds a tick finds one; halving what remains of the window
        then reaches the latest in a few steps, however close together the ticks.
        """
        end = now.astimezone(UTC).replace(microsecond=0)
        for back in _LOOK_BACKS:
            found = self._tick_after(end - back)
            if found is not None and found <= end:
                break
        else:
            return None
        # `found` is a tick, and none lies in (high, end]: the latest is in [found, high].
        high = end
        while True:
            following = self._tick_after(found)
            if following is None or following > high:
                return found.astimezone(self.zone)
            found = following
            # More ticks than one in the window: try the second half of what remains.
            middle = found + (high - found) // _SECOND // 2 * _SECOND
            later = self._tick_after(middle)
            if later is not None and later <= high:
                found = later
            else:
                high = middle

    def next_tick(self, now: datetime) -> datetime | None:
        """The first tick after `now`, in the schedule's zone."""
        tick = self._tick_after(now)
        return None if tick is None else tick.astimezone(self.zone)

    def next_ticks(self, now: datetime, count: int) -> list[datetime]:
        """The first `count` ticks after `now` (fewer past cronsim's horizon), in its zone."""
        ticks: list[datetime] = []
        tick = self.next_tick(now)
        while tick is not None and len(ticks) < count:
            ticks.append(tick)
            tick = self.next_tick(tick)
        return ticks

    def catch_up_allows(self, tick: datetime, now: datetime, first_seen: datetime) -> bool:
        """Whether a tick that is due at `now` still runs, or is skipped as missed.

        The schedule's own `catch_up` decides first, for every tick; without it, a
        tick from before the schedule was first seen is skipped (a nightly job
        deployed at 10:00 does not run its 02:00 tick), and `PERIODIC_CATCH_UP`
        limits how late any other may run.
        """
        late = now - tick
        if self.catch_up is True:
            return True
        if isinstance(self.catch_up, timedelta):
            return late <= self.catch_up
        if tick < first_seen:
            return False
        limit = venturi_settings.PERIODIC_CATCH_UP
        return limit is None or late <= limit

    def _tick_after(self, moment: datetime) -> datetime | None:
        """The first tick after the instant `moment`, in UTC (None past cronsim's horizon).

        cronsim gives the next matching clock time in naive local time, where it is
        exact; the instants a clock time stands for are decided here, one stretch of
        constant UTC offset at a time. A clock time repeated when the clocks go back
        is a tick in each pass, except a fixed time (five fields, minute and hour
        without `*`), which runs in the first pass only; a clock time skipped when
        they go forward is no tick, except a fixed time, which runs at the shift.
        Those are Debian cron's rules, which cronsim follows; its own arithmetic
        across a shift misses ticks after a half-hour one (Australia/Lord_Howe).
        """
        zone = self.zone
        fixed = _fixed_time(self.cron)
        # Ticks are whole seconds: after `moment` is after its whole second.
        lower = begin = moment.astimezone(UTC).replace(microsecond=0)
        offset = _utc_offset(begin, zone)
        while True:
            # Ticks after `lower`, with `offset` in force from `begin` on.
            wall = self._clock_time_after(_naive(lower + offset))
            if wall is None:
                return None
            tick = wall.replace(tzinfo=UTC) - offset
            if tick - begin <= 3 * _DAY:
                shift = _next_shift(begin, tick, zone)
            else:
                # Far ahead, which only a shift in the next hours (the second pass of a
                # repeated hour) or one near the tick can change: jump to two days before.
                shift = _next_shift(begin, begin + _DAY, zone)
                if shift is None:
                    lower = begin = tick - 2 * _DAY
                    offset = _utc_offset(begin, zone)
                    continue
            if shift is None:
                if fixed and wall.replace(tzinfo=zone).astimezone(UTC) < tick:
                    lower = tick  # the repeated hour's second pass: ran in the first
                    continue
                return tick
            before, offset = offset, _utc_offset(shift, zone)
            if fixed and offset > before:
                skipped = self._clock_time_after(_naive(shift + before) - _SECOND)
                if skipped is not None and skipped < _naive(shift + offset):
                    return shift
            lower, begin = shift - _SECOND, shift

    def _clock_time_after(self, wall: datetime) -> datetime | None:
        """cronsim's first clock time after the naive local time `wall`."""
        CronSim = cron_class()
        return next(iter(CronSim(self.cron, wall)), None)

    def instance(self) -> object:
        """The task instance each tick enqueues."""
        return registry.get(self.kind).cls(**self.payload)


def cron_class() -> Any:
    """cronsim's CronSim, or a clear error when the `periodic` extra is not installed."""
    try:
        from cronsim import CronSim
    except ImportError:
        raise ScheduleError(
            "periodic tasks need the cronsim package: pip install django-venturi[periodic]"
        ) from None
    return CronSim


_declared: dict[str, Schedule] = {}
"""Schedules of `@venturi.periodic`, by kind."""


def periodic(
    cron: str,
    *,
    timezone: str | None = None,
    payload: dict[str, Any] | None = None,
    catch_up: CatchUp = None,
) -> Callable[[T], T]:
    """Run a task on a cron schedule; put it above `@venturi.task`.

    `payload` gives the task's field values (JSON-able, checked now); without
    it the task must build with no arguments. `timezone` is an IANA name
    (default: Django's `TIME_ZONE`). `catch_up` is how late a missed tick may
    still run, even one from before the schedule was first seen (True: however
    late); None (the default): `PERIODIC_CATCH_UP` limits it, and a tick from
    before the schedule was first seen is skipped.
    """

    def register(target: T) -> T:
        spec = getattr(target, "venturi_spec", None)
        if spec is None or spec.cls is not target:
            raise RegistrationError(
                f"@venturi.periodic goes above @venturi.task on {target.__qualname__}"
            )
        schedule = Schedule(
            kind=spec.kind,
            cron=cron,
            timezone=timezone,
            payload=dict(payload or {}),
            origin=f"@venturi.periodic on {spec.origin}",
            catch_up=catch_up,
        )
        try:
            validate(schedule)
        except ScheduleError as error:
            raise RegistrationError(str(error)) from None
        _declared[spec.kind] = schedule
        return target

    return register


def validate(schedule: Schedule) -> None:
    """Raise ScheduleError naming what is wrong with a schedule."""
    CronSim = cron_class()
    from cronsim import CronSimError

    where = schedule.origin
    if not isinstance(schedule.cron, str):
        raise ScheduleError(f"{where}: cron must be a str, got {schedule.cron!r}")
    try:
        CronSim(schedule.cron, datetime(2000, 1, 1))
    except (CronSimError, ValueError) as error:
        raise ScheduleError(f"{where}: bad cron expression {schedule.cron!r}: {error}") from None
    if schedule.timezone is not None:
        try:
            ZoneInfo(schedule.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ScheduleError(f"{where}: unknown timezone {schedule.timezone!r}") from None
    catch_up = schedule.catch_up
    if not (
        catch_up is None
        or catch_up is True
        or (isinstance(catch_up, timedelta) and catch_up > timedelta(0))
    ):
        raise ScheduleError(
            f"{where}: catch_up must be a positive timedelta, True or None, got {catch_up!r}"
        )
    if not isinstance(schedule.payload, dict):
        raise ScheduleError(f"{where}: payload must be a dict of field values")
    try:
        spec = registry.get(schedule.kind)
    except UnknownKind:
        raise ScheduleError(f"{where}: no task is registered under {schedule.kind!r}") from None
    try:
        instance = spec.cls(**schedule.payload)
        spec.encode(instance)
    except (TypeError, ValueError) as error:
        raise ScheduleError(f"{where}: payload does not fit {spec.origin}: {error}") from None


def from_settings() -> list[Schedule]:
    """`VENTURI["PERIODIC"]` as schedules (call `validate` on each)."""
    schedules = []
    for index, entry in enumerate(venturi_settings.PERIODIC):
        origin = f"VENTURI['PERIODIC'][{index}]"
        if not isinstance(entry, dict) or not {"task", "cron"} <= set(entry):
            raise ScheduleError(f"{origin} must be a dict with 'task' and 'cron' keys")
        unknown = set(entry) - {"task", "cron", "timezone", "payload", "catch_up"}
        if unknown:
            raise ScheduleError(f"{origin}: unknown keys {', '.join(sorted(unknown))}")
        schedules.append(
            Schedule(
                kind=str(entry["task"]),
                cron=entry["cron"],
                timezone=entry.get("timezone"),
                payload=entry.get("payload") or {},
                origin=origin,
                catch_up=_catch_up_setting(entry.get("catch_up")),
            )
        )
    return schedules


def _catch_up_setting(value: Any) -> Any:
    """A settings entry's `catch_up`, whose duration may be a number of seconds, as
    `PERIODIC_CATCH_UP`'s; `validate` names a value that is none of the kinds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    return value


def schedules() -> list[Schedule]:
    """Every periodic schedule: declared by decorator, then from settings (same kind: settings)."""
    by_kind = dict(_declared)
    for schedule in from_settings():
        by_kind[schedule.kind] = schedule
    return [by_kind[kind] for kind in sorted(by_kind)]


def errors() -> list[str]:
    """What is wrong with the periodic schedules (for the system check)."""
    try:
        found = schedules()
    except ScheduleError as error:
        return [str(error)]
    problems = []
    for schedule in found:
        try:
            validate(schedule)
            check_payload_size(schedule)
        except ScheduleError as error:
            problems.append(str(error))
    return problems


def check_payload_size(schedule: Schedule) -> None:
    """Raise ScheduleError when a valid schedule's payload is over `VENTURI["MAX_PAYLOAD_BYTES"]`.

    Each of its ticks would be refused (the worker logs an error and enqueues nothing).
    The system check asks; the decorator does not, as it runs at import, where settings
    are not read.
    """
    spec = registry.get(schedule.kind)
    payload = spec.encode(spec.cls(**schedule.payload))
    try:
        check_size(payload, spec.cls.__name__, venturi_settings.MAX_PAYLOAD_BYTES)
    except PayloadTooLarge as error:
        raise ScheduleError(f"{schedule.origin}: {error}: every tick would be refused") from None
