"""Periodic (cron) jobs: each due tick enqueued exactly once, by whichever worker gets there.

Declared on a task class with `@venturi.periodic("*/5 * * * *", timezone=...)`
(above `@venturi.task`), or in settings as `VENTURI["PERIODIC"]`. Cron
expressions are parsed by `cronsim` (five fields, or six with seconds first),
which finds the matching clock times of the schedule's time zone; which instants
those stand for across daylight-saving changes follows Debian cron's rules (see
`Schedule._tick_after`). Ticks are compared as instants, never as clock times.

Every worker makes a scheduler pass every `PERIODIC_INTERVAL`: for each
schedule, the latest tick at or before the database's `now()` is inserted as a
job with `periodic_tick` set, if it is later than the kind's tick recorded in
`PeriodicTick`. The tick is recorded in the statement (PostgreSQL) or the
IMMEDIATE transaction (SQLite) that inserts its job, and the row outlives the
job: however many workers pass at once, and whenever cleanup deletes the job, a
tick is one job. Only the latest tick is ever considered: ticks missed while no
worker ran are not replayed; the latest missed one runs when a worker is back,
unless it is older than `PERIODIC_CATCH_UP` (then it is recorded as skipped).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import IntegrityError, connections, transaction

from django_venturi.clock import database_time
from django_venturi.conf import venturi_settings
from django_venturi.reconnect import DATABASE_ERRORS
from django_venturi.registry import RegistrationError, UnknownKind, registry
from django_venturi.states import State

if TYPE_CHECKING:
    from django_venturi.enqueue import NewJob

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
    cron: str, *, timezone: str | None = None, payload: dict[str, Any] | None = None
) -> Callable[[T], T]:
    """Run a task on a cron schedule; put it above `@venturi.task`.

    `payload` gives the task's field values (JSON-able, checked now); without
    it the task must build with no arguments. `timezone` is an IANA name
    (default: Django's `TIME_ZONE`).
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
        unknown = set(entry) - {"task", "cron", "timezone", "payload"}
        if unknown:
            raise ScheduleError(f"{origin}: unknown keys {', '.join(sorted(unknown))}")
        schedules.append(
            Schedule(
                kind=str(entry["task"]),
                cron=entry["cron"],
                timezone=entry.get("timezone"),
                payload=entry.get("payload") or {},
                origin=origin,
            )
        )
    return schedules


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
        except ScheduleError as error:
            problems.append(str(error))
    return problems


# ------------------------------------------------------------ enqueueing ticks


def enqueue_tick(alias: str, schedule: Schedule, tick: datetime) -> int | None:
    """Record the tick and insert its job, in one transaction; return the job's id.

    None when the kind's recorded tick is this one or a later one (another worker
    handled it, or it was enqueued and its job cleaned up since), or when the
    insert meets a conflict: a ready job of the task's dedup key is in the way (the
    tick is recorded all the same), or the tick's job is there from before ticks
    were recorded.
    """
    from django_venturi.enqueue import prepare

    new = prepare(schedule.instance(), delay=None, run_at=None, priority=None, queue=None)
    if connections[alias].vendor != "postgresql":
        return _enqueue_tick_sqlite(alias, new, tick)
    return _enqueue_tick_postgresql(alias, new, tick)


def skip_tick(alias: str, kind: str, tick: datetime) -> bool:
    """Record a tick that gets no job (missed by more than `PERIODIC_CATCH_UP`).

    False when the kind's recorded tick is this one or a later one already.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        with transaction.atomic(using=alias):
            if not _later_than_recorded(alias, kind, tick):
                return False
            _record(alias, kind, tick, job_id=None)
            return True
    with connection.cursor() as cursor:
        cursor.execute(_SKIP_TICK_SQL.format(**_tables(alias)), [kind, tick])
        return cursor.fetchone() is not None


def _tables(alias: str) -> dict[str, str]:
    from django_venturi.models import Job, PeriodicTick

    quote = connections[alias].ops.quote_name
    return {"jobs": quote(Job._meta.db_table), "ticks": quote(PeriodicTick._meta.db_table)}


def _enqueue_tick_postgresql(alias: str, new: NewJob, tick: datetime) -> int | None:
    tables = _tables(alias)
    params: list[Any] = [
        tables["jobs"],
        new.kind,
        tick,
        new.kind,
        new.queue,
        new.priority,
        State.READY.value,
        json.dumps(new.payload),
        new.dedup_key,
        tick,
        tick,
        venturi_settings.NOTIFY_CHANNEL,
    ]
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(_ENQUEUE_TICK_SQL.format(**tables), params)
        row = cursor.fetchone()
        if row is None:
            return None  # the kind's recorded tick is this one or a later one
        if row[1] is None:
            # The insert met a conflict: record the job that holds the tick, if any,
            # rather than the id of a job that was never inserted.
            cursor.execute(_HOLDER_SQL.format(**tables), [new.kind, tick, new.kind])
            return None
    return int(row[1])


def _enqueue_tick_sqlite(alias: str, new: NewJob, tick: datetime) -> int | None:
    from django_venturi.models import Job

    jobs = Job.objects.using(alias)
    # SQLite: the IMMEDIATE transaction holds the write lock from its first
    # statement, so nobody records or inserts the tick between these checks and the writes.
    with transaction.atomic(using=alias):
        if not _later_than_recorded(alias, new.kind, tick):
            return None
        holder = jobs.filter(kind=new.kind, periodic_tick=tick).values_list("id", flat=True)
        job_id = holder.first()
        if job_id is not None:  # enqueued before ticks were recorded
            _record(alias, new.kind, tick, job_id=job_id)
            return None
        try:
            with transaction.atomic(using=alias):
                job = jobs.create(
                    kind=new.kind,
                    queue=new.queue,
                    priority=new.priority,
                    state=State.READY,
                    payload=new.payload,
                    dedup_key=new.dedup_key,
                    run_at=tick,
                    enqueued_at=database_time(alias),
                    periodic_tick=tick,
                )
        except IntegrityError:
            _record(alias, new.kind, tick, job_id=None)
            return None  # a ready job of the task's dedup key is in the way
        _record(alias, new.kind, tick, job_id=int(job.pk))
    return int(job.pk)


def _later_than_recorded(alias: str, kind: str, tick: datetime) -> bool:
    from django_venturi.models import PeriodicTick

    return not PeriodicTick.objects.using(alias).filter(kind=kind, tick__gte=tick).exists()


def _record(alias: str, kind: str, tick: datetime, *, job_id: int | None) -> None:
    """Record the kind's latest tick (SQLite, in the transaction that checked it)."""
    from django_venturi.models import PeriodicTick

    PeriodicTick.objects.using(alias).update_or_create(
        kind=kind,
        defaults={"tick": tick, "job_id": job_id, "handled_at": database_time(alias)},
    )


_ENQUEUE_TICK_SQL = """
    WITH new_job AS (
        -- The job's id, drawn first, so the tick's row can name the job it inserts.
        SELECT nextval(pg_get_serial_sequence(%s, 'id')) AS id
    ), recorded AS (
        -- Record the tick only if it is later than the kind's recorded one: the row
        -- outlives the job, so a tick whose job was cleaned up is not enqueued again.
        -- A worker recording the same tick at the same moment waits for this row's
        -- lock, then finds the tick no longer later: nothing to do.
        INSERT INTO {ticks} AS latest (kind, tick, job_id, handled_at)
        SELECT %s, %s, id, now() FROM new_job
        ON CONFLICT (kind) DO UPDATE
            SET tick = excluded.tick, job_id = excluded.job_id, handled_at = excluded.handled_at
            WHERE latest.tick < excluded.tick
        RETURNING job_id
    ), inserted AS (
        -- The job, only if the tick was recorded. A ready job of the task's dedup key
        -- in the way, or the tick's job from before ticks were recorded: no insert.
        INSERT INTO {jobs}
            (id, kind, queue, priority, state, payload, dedup_key, attempt, failures,
             run_at, enqueued_at, claimed_by, last_error, periodic_tick)
        SELECT job_id, %s, %s, %s, %s, %s::jsonb, %s, 0, 0, %s, now(), '', '', %s
        FROM recorded
        ON CONFLICT DO NOTHING
        RETURNING id, queue
    )
    SELECT recorded.job_id, inserted.id,
           CASE WHEN inserted.id IS NOT NULL THEN pg_notify(%s, inserted.queue) END
    FROM recorded LEFT JOIN inserted ON true
"""

_HOLDER_SQL = """
    UPDATE {ticks} SET job_id = (
        SELECT id FROM {jobs} WHERE kind = %s AND periodic_tick = %s
    )
    WHERE kind = %s
"""

_SKIP_TICK_SQL = """
    INSERT INTO {ticks} AS latest (kind, tick, job_id, handled_at)
    VALUES (%s, %s, NULL, now())
    ON CONFLICT (kind) DO UPDATE
        SET tick = excluded.tick, job_id = NULL, handled_at = excluded.handled_at
        WHERE latest.tick < excluded.tick
    RETURNING kind
"""


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
        """Enqueue the tick, or record it skipped if it was missed by more than the
        catch-up; return the id of the job this created, if it did."""
        instant = tick.astimezone(UTC)
        catch_up = venturi_settings.PERIODIC_CATCH_UP
        extra = {"kind": schedule.kind}
        if catch_up is not None and now - instant > catch_up:
            if skip_tick(self.alias, schedule.kind, instant):
                logger.info(
                    "periodic %s: tick %s missed by more than %s; skipped",
                    schedule.kind,
                    tick.isoformat(),
                    catch_up,
                    extra=extra,
                )
            return None
        job_id = enqueue_tick(self.alias, schedule, instant)
        if job_id is not None:
            logger.info(
                "periodic %s: enqueued job %d for tick %s",
                schedule.kind,
                job_id,
                tick.isoformat(),
                extra={**extra, "job_id": job_id},
            )
        return job_id
