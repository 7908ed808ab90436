"""Periodic jobs: ticks computed by cronsim, each enqueued once however many workers pass."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

import django_venturi as venturi
from django_venturi.checks import check_periodic
from django_venturi.models import Job, PeriodicTick, ScheduleState
from django_venturi.periodic import Schedule, ScheduleError, _declared, schedules
from django_venturi.registry import RegistrationError, registry
from django_venturi.store.retention import cleanup
from django_venturi.worker.scheduler import Scheduler
from tests.conftest import Workers, wait_until
from tests.testapp.models import Record

PARIS = ZoneInfo("Europe/Paris")


def noop_every(cron: str, **extra: object) -> dict[str, object]:
    return {"task": "tests.noop", "cron": cron, "payload": {"n": 1}, **extra}


def with_periodic(*entries: dict[str, object], **more: object) -> override_settings:
    from django.conf import settings

    return override_settings(VENTURI={**settings.VENTURI, "PERIODIC": list(entries), **more})


def seen_long_ago(alias: str, kind: str = "tests.noop") -> None:
    """Record the kind's schedule as seen in 2000: its missed ticks are caught up as they
    always were (a schedule first seen now skips the ticks before, `test_schedules.py`)."""
    first_seen = datetime(2000, 1, 1, tzinfo=UTC)
    ScheduleState.objects.using(alias).create(kind=kind, first_seen_at=first_seen)


# ------------------------------------------------------------ ticks


def test_latest_and_next_tick() -> None:
    schedule = Schedule("tests.noop", "*/5 * * * *", "UTC", {}, "test")
    now = datetime(2026, 5, 1, 10, 7, 30, tzinfo=UTC)
    assert schedule.latest_tick(now) == datetime(2026, 5, 1, 10, 5, tzinfo=UTC)
    assert schedule.next_tick(now) == datetime(2026, 5, 1, 10, 10, tzinfo=UTC)
    on_the_tick = datetime(2026, 5, 1, 10, 10, tzinfo=UTC)
    assert schedule.latest_tick(on_the_tick) == on_the_tick


def test_daylight_saving_changes_follow_debian_cron() -> None:
    daily = Schedule("tests.noop", "30 2 * * *", "Europe/Paris", {}, "test")
    # 29 March 2026: 02:00 -> 03:00 in Paris; the skipped 02:30 runs once, at the shift.
    before_spring = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
    tick = daily.next_tick(before_spring)
    assert tick is not None and tick.astimezone(UTC) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    # 25 October 2026: 03:00 -> 02:00; 02:30 happens twice, the job runs once.
    before_autumn = datetime(2026, 10, 24, 23, 0, tzinfo=UTC)
    first = daily.next_tick(before_autumn)
    assert first is not None
    second = daily.next_tick(first)
    assert second is not None and second - first > timedelta(hours=23)


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)  # type: ignore[arg-type]


def instant(tick: datetime | None) -> datetime:
    assert tick is not None
    return tick.astimezone(UTC)


# On 25 October 2026 in Paris, 03:00 CEST (01:00 UTC) becomes 02:00 CET: the hour
# from 02:00 to 03:00 happens twice, first at UTC+2 (00:00-01:00 UTC), then at UTC+1
# (01:00-02:00 UTC).


def test_an_hourly_schedule_ticks_in_both_passes_of_the_repeated_hour() -> None:
    hourly = Schedule("tests.noop", "0 * * * *", "Europe/Paris", {}, "test")
    first_pass, second_pass = utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)
    assert instant(hourly.latest_tick(first_pass)) == utc(2026, 10, 25, 0)  # 02:00 CEST
    assert instant(hourly.next_tick(first_pass)) == utc(2026, 10, 25, 1)
    tick = hourly.latest_tick(second_pass)
    assert tick is not None and tick.isoformat() == "2026-10-25T02:00:00+01:00"
    assert instant(tick) == utc(2026, 10, 25, 1)
    assert instant(hourly.next_tick(second_pass)) == utc(2026, 10, 25, 2)  # 03:00 CET


def test_a_fixed_time_in_the_repeated_hour_ticks_in_its_first_pass_only() -> None:
    nightly = Schedule("tests.noop", "30 2 * * *", "Europe/Paris", {}, "test")
    assert instant(nightly.latest_tick(utc(2026, 10, 25, 0, 10))) == utc(2026, 10, 24, 0, 30)
    # From the first 02:30 on, through the second pass, that is the latest tick; not the
    # previous day's, whose job, cleaned up, would run again.
    for now in (utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 10), utc(2026, 10, 25, 1, 40)):
        assert instant(nightly.latest_tick(now)) == utc(2026, 10, 25, 0, 30), now
        # The next is the 26th's (02:30 CET), not the first pass's, already gone.
        assert instant(nightly.next_tick(now)) == utc(2026, 10, 26, 1, 30), now


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_each_pass_of_the_repeated_hour_has_its_job(alias: str) -> None:
    seen_long_ago(alias)
    with with_periodic(noop_every("0 * * * *", timezone="Europe/Paris")):
        scheduler, now = Scheduler(alias), utc(2026, 10, 24, 23, 50)
        while now < utc(2026, 10, 25, 2, 10):
            scheduler.run_pass(now)  # the same process throughout: it remembers its ticks
            now += timedelta(minutes=5)
    ticks = (
        Job.objects.using(alias).order_by("periodic_tick").values_list("periodic_tick", flat=True)
    )
    assert [tick.astimezone(PARIS).strftime("%H:%M %Z") for tick in ticks if tick] == [
        "01:00 CEST",
        "02:00 CEST",
        "02:00 CET",
        "03:00 CET",
    ]


def test_ticks_across_the_spring_shift() -> None:
    # 29 March 2026 in Paris: 02:00 CET (01:00 UTC) becomes 03:00 CEST.
    nightly = Schedule("tests.noop", "30 2 * * *", "Europe/Paris", {}, "test")
    assert instant(nightly.latest_tick(utc(2026, 3, 29, 0, 50))) == utc(2026, 3, 28, 1, 30)
    assert instant(nightly.next_tick(utc(2026, 3, 29, 0, 50))) == utc(2026, 3, 29, 1)  # the shift
    assert instant(nightly.latest_tick(utc(2026, 3, 29, 1, 10))) == utc(2026, 3, 29, 1)
    hourly = Schedule("tests.noop", "0 * * * *", "Europe/Paris", {}, "test")
    assert instant(hourly.latest_tick(utc(2026, 3, 29, 0, 59))) == utc(2026, 3, 29, 0)  # 01:00
    assert instant(hourly.next_tick(utc(2026, 3, 29, 0, 59))) == utc(2026, 3, 29, 1)  # 03:00
    # 4 October 2026 on Lord Howe Island: 02:00 (UTC+10:30, 15:30 UTC) becomes 02:30
    # (UTC+11), half an hour ahead.
    at_59 = Schedule("tests.noop", "59 * * * *", "Australia/Lord_Howe", {}, "test")
    tick = at_59.latest_tick(utc(2026, 10, 3, 15, 40))  # 02:40
    assert tick is not None and tick.isoformat() == "2026-10-04T01:59:00+10:30"
    at_30 = Schedule("tests.noop", "30 * * * *", "Australia/Lord_Howe", {}, "test")
    tick = at_30.next_tick(utc(2026, 10, 3, 15, 1))  # 01:31
    assert tick is not None and tick.isoformat() == "2026-10-04T02:30:00+11:00"
    skipped = Schedule("tests.noop", "15 2 * * *", "Australia/Lord_Howe", {}, "test")
    assert instant(skipped.latest_tick(utc(2026, 10, 3, 16))) == utc(2026, 10, 3, 15, 30)


def counted_cronsim_steps(monkeypatch: pytest.MonkeyPatch) -> list[datetime]:
    from cronsim import CronSim

    steps: list[datetime] = []

    class Counting(CronSim):
        def __next__(self) -> datetime:
            steps.append(super().__next__())
            return steps[-1]

    # (The package's `periodic` is the decorator: the module by its name.)
    monkeypatch.setattr(
        importlib.import_module("django_venturi.periodic"), "cron_class", lambda: Counting
    )
    return steps


@pytest.mark.parametrize("cron", ["* * * * *", "*/10 * * * * *", "*/5 * * * *"])
def test_a_frequent_schedule_costs_a_few_cronsim_steps(
    cron: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = Schedule("tests.noop", cron, "Europe/Paris", {}, "test")
    second_pass = utc(2026, 10, 25, 1, 5, 30)  # 02:05:30 CET
    expected = {"* * * * *": "02:05:00", "*/10 * * * * *": "02:05:30", "*/5 * * * *": "02:05:00"}
    steps = counted_cronsim_steps(monkeypatch)
    tick = schedule.latest_tick(second_pass)
    assert tick is not None and tick.isoformat() == f"2026-10-25T{expected[cron]}+01:00"
    assert len(steps) <= 12, steps  # not a day's (or an hour's) worth of ticks
    steps.clear()
    assert schedule.latest_tick(utc(2026, 5, 6, 10, 7, 30)) is not None
    assert len(steps) <= 12, steps


def test_a_leap_day_schedule_skips_the_years_without_29_february() -> None:
    leap_day = Schedule("tests.noop", "0 0 29 2 *", "Europe/Paris", {}, "test")
    # 2100 is no leap year: after 29 February 2096 comes 29 February 2104.
    tick = leap_day.latest_tick(utc(2103, 12, 31))
    assert tick is not None and tick.isoformat() == "2096-02-29T00:00:00+01:00"
    tick = leap_day.next_tick(utc(2096, 3, 1))
    assert tick is not None and tick.isoformat() == "2104-02-29T00:00:00+01:00"


def test_a_yearly_tick_in_the_repeated_autumn_hour_is_that_days_in_its_second_pass() -> None:
    # Once a year, at a time of the repeated hour: in its second pass, the latest tick is
    # that day's, not last year's.
    yearly = Schedule("tests.noop", "30 2 25 10 *", "Europe/Paris", {}, "test")
    assert instant(yearly.latest_tick(utc(2026, 10, 25, 1, 10))) == utc(2026, 10, 25, 0, 30)
    assert instant(yearly.next_tick(utc(2026, 10, 25, 1, 10))) == utc(2027, 10, 25, 0, 30)


SHIFTS = {
    "Europe/Paris": [utc(2026, 3, 29, 1), utc(2026, 10, 25, 1)],
    "America/New_York": [utc(2026, 3, 8, 7), utc(2026, 11, 1, 6)],
    "Australia/Lord_Howe": [utc(2026, 4, 4, 15), utc(2026, 10, 3, 15, 30)],
}


@pytest.mark.parametrize("zone", sorted(SHIFTS))
def test_latest_and_next_tick_agree_around_daylight_saving_changes(zone: str) -> None:
    for cron in ("*/20 * * * *", "0 * * * *", "30 1,2 * * *", "59 1 * * *", "0 */2 * * *"):
        schedule = Schedule("tests.noop", cron, zone, {}, "test")
        for shift in SHIFTS[zone]:
            now = shift - timedelta(hours=3)
            while now < shift + timedelta(hours=3):
                latest = instant(schedule.latest_tick(now))
                following = instant(schedule.next_tick(latest))
                assert latest <= now < following, (cron, now)
                assert instant(schedule.next_tick(now)) == following, (cron, now)
                now += timedelta(minutes=7)


# ------------------------------------------------------------ scheduler passes


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_a_tick_is_enqueued_once_and_missed_ticks_are_not_replayed(alias: str) -> None:
    seen_long_ago(alias)
    start = datetime(2026, 5, 1, 10, 7, 30, tzinfo=UTC)
    with with_periodic(noop_every("*/5 * * * *", timezone="UTC")):
        first, second = Scheduler(alias), Scheduler(alias)
        created = first.run_pass(start)
        assert len(created) == 1
        job = Job.objects.using(alias).get(id=created[0])
        assert job.periodic_tick == job.run_at == datetime(2026, 5, 1, 10, 5, tzinfo=UTC)
        assert job.payload == {"n": 1} and job.state == venturi.State.READY
        assert first.run_pass(start) == []  # same tick, same process: no query
        assert second.run_pass(start) == []  # same tick, another worker: the index says no
        # Three ticks pass with no worker: only the latest one is enqueued.
        created = second.run_pass(start + timedelta(minutes=16))
        assert len(created) == 1
        ticks = Job.objects.using(alias).order_by("periodic_tick")
        assert [j.periodic_tick.minute for j in ticks] == [5, 20]  # type: ignore[union-attr]


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_catch_up_limit_skips_a_tick_missed_too_long_ago(alias: str) -> None:
    seen_long_ago(alias)
    start = datetime(2026, 5, 1, 10, 7, 30, tzinfo=UTC)
    with with_periodic(noop_every("*/5 * * * *"), PERIODIC_CATCH_UP=timedelta(minutes=1)):
        assert Scheduler(alias).run_pass(start) == []  # 10:05 is 2.5 minutes late
        assert len(Scheduler(alias).run_pass(start.replace(minute=10, second=20))) == 1


def recorded(alias: str, kind: str = "tests.noop") -> tuple[datetime, int | None]:
    row = PeriodicTick.objects.using(alias).get(kind=kind)
    return row.tick, row.job_id


def finish_and_clean_up(alias: str) -> None:
    """Every job ends completed and is cleaned up."""
    Job.objects.using(alias).update(
        state=venturi.State.COMPLETED, attempt=1, finished_at=datetime.now(UTC)
    )
    assert cleanup(older_than=timedelta(0), using=alias).jobs >= 1
    assert not Job.objects.using(alias).exists()


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_tick_whose_job_was_cleaned_up_is_not_enqueued_again(alias: str) -> None:
    seen_long_ago(alias)
    start = datetime(2026, 5, 1, 10, 7, 30, tzinfo=UTC)
    with with_periodic(noop_every("*/5 * * * *", timezone="UTC")):
        (job_id,) = Scheduler(alias).run_pass(start)
        assert recorded(alias) == (datetime(2026, 5, 1, 10, 5, tzinfo=UTC), job_id)
        finish_and_clean_up(alias)
        # A fresh worker (a deploy, a scale-up), however late within the tick: nothing.
        assert Scheduler(alias).run_pass(start + timedelta(minutes=2)) == []
        assert not Job.objects.using(alias).exists()
        assert recorded(alias) == (datetime(2026, 5, 1, 10, 5, tzinfo=UTC), job_id)
        # The next tick is enqueued, and recorded with its job.
        (later,) = Scheduler(alias).run_pass(start + timedelta(minutes=3))
        assert recorded(alias) == (datetime(2026, 5, 1, 10, 10, tzinfo=UTC), later)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_skipped_tick_is_recorded_and_never_enqueued_later(alias: str) -> None:
    seen_long_ago(alias)
    start = datetime(2026, 5, 1, 10, 7, 30, tzinfo=UTC)
    with with_periodic(noop_every("*/5 * * * *"), PERIODIC_CATCH_UP=timedelta(minutes=1)):
        assert Scheduler(alias).run_pass(start) == []  # 10:05 is 2.5 minutes late
    assert recorded(alias) == (datetime(2026, 5, 1, 10, 5, tzinfo=UTC), None)
    with with_periodic(noop_every("*/5 * * * *")):  # catch-up without a limit
        assert Scheduler(alias).run_pass(start) == []
    assert not Job.objects.using(alias).exists()


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_tick_enqueued_before_ticks_were_recorded_is_not_enqueued_twice(alias: str) -> None:
    seen_long_ago(alias)
    start = datetime(2026, 5, 1, 10, 7, 30, tzinfo=UTC)
    with with_periodic(noop_every("*/5 * * * *", timezone="UTC")):
        (job_id,) = Scheduler(alias).run_pass(start)
        PeriodicTick.objects.using(alias).all().delete()  # as after the upgrade
        assert Scheduler(alias).run_pass(start) == []  # the job's unique tick says no
        assert recorded(alias) == (datetime(2026, 5, 1, 10, 5, tzinfo=UTC), job_id)
        assert Job.objects.using(alias).count() == 1


@pytest.fixture
def declared() -> Iterator[None]:
    yield
    _declared.clear()
    registry.unregister("tests.periodic_report")


def test_the_periodic_decorator_registers_a_schedule_with_its_payload(declared: None) -> None:
    @venturi.periodic("0 9 * * 1-5", timezone="Europe/Paris", payload={"scope": "weekly"})
    @venturi.task(kind="tests.periodic_report")
    @dataclasses.dataclass
    class Report:
        scope: str

        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            return venturi.Outcome.completed()

    (schedule,) = schedules()
    assert schedule.kind == "tests.periodic_report" and schedule.zone == PARIS
    assert schedule.instance() == Report(scope="weekly")
    assert "@venturi.periodic on" in schedule.origin


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"cron": "61 * * * *"}, "bad cron expression '61 \\* \\* \\* \\*'"),
        ({"cron": "* * *"}, "bad cron expression"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({"cron": "* * * * *", "payload": {"nope": 1}}, "payload does not fit"),
    ],
)
def test_the_decorator_refuses_bad_schedules(
    declared: None, arguments: dict[str, object], message: str
) -> None:
    with pytest.raises(RegistrationError, match=message):

        @venturi.periodic(**arguments)  # type: ignore[arg-type]
        @venturi.task(kind="tests.periodic_report")
        @dataclasses.dataclass
        class Report:
            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()


def test_the_decorator_goes_above_task(declared: None) -> None:
    with pytest.raises(RegistrationError, match=r"goes above @venturi\.task"):

        @venturi.task(kind="tests.periodic_report")
        @venturi.periodic("* * * * *")
        @dataclasses.dataclass
        class Report:
            def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()


def test_the_system_check_names_the_bad_entry() -> None:
    good = noop_every("*/5 * * * *")
    with with_periodic(good, {"task": "tests.nope", "cron": "* * * * *"}):
        errors = [e for e in check_periodic() if e.id == "venturi.E044"]
    assert len(errors) == 1
    assert "VENTURI['PERIODIC'][1]: no task is registered under 'tests.nope'" in errors[0].msg
    with with_periodic({"cron": "* * * * *"}):
        errors = [e for e in check_periodic() if e.id == "venturi.E044"]
    assert "VENTURI['PERIODIC'][0] must be a dict with 'task' and 'cron' keys" in errors[0].msg
    with with_periodic(good):
        assert not check_periodic()
    with (
        pytest.raises(ScheduleError),
        with_periodic({"task": "tests.noop", "cron": "* * * * *", "when": 1}),
    ):
        schedules()


# ------------------------------------------------------------ the admin


@pytest.mark.django_db
def test_the_admin_lists_periodic_tasks_with_next_and_last_run() -> None:
    seen_long_ago("default")
    with with_periodic(noop_every("*/5 * * * *", timezone="Europe/Paris")):
        (job_id,) = Scheduler("default").run_pass(datetime(2026, 5, 1, 10, 7, tzinfo=UTC))
        User.objects.create_superuser("admin", "admin@example.com", "pw")
        client = Client()
        client.login(username="admin", password="pw")
        page = client.get("/admin/django_venturi/periodictask/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "tests.noop" in html and "*/5 * * * *" in html and "Europe/Paris" in html
    assert f"/admin/django_venturi/job/{job_id}/change/" in html  # the last run
    assert "2026-05-01 10:05:00 UTC" in html  # shown in the site's time zone
    index = client.get("/admin/")
    assert "Periodic tasks" in index.content.decode()


@pytest.mark.django_db
def test_the_admin_shows_the_last_run_after_its_job_is_cleaned_up() -> None:
    seen_long_ago("default")
    with with_periodic(noop_every("*/5 * * * *", timezone="Europe/Paris")):
        (job_id,) = Scheduler("default").run_pass(datetime(2026, 5, 1, 10, 7, tzinfo=UTC))
        finish_and_clean_up("default")
        User.objects.create_superuser("admin", "admin@example.com", "pw")
        client = Client()
        client.login(username="admin", password="pw")
        html = client.get("/admin/django_venturi/periodictask/").content.decode()
    last_run = html.split("<td>tests.noop</td>")[1].split("</tr>")[0]
    assert f"2026-05-01 10:05:00 UTC (job #{job_id}, cleaned up)" in last_run
    assert "/admin/django_venturi/job/" not in last_run
    assert "handled " in last_run


# ------------------------------------------------------------ real workers


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_several_workers_enqueue_each_tick_exactly_once(
    alias: str, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every second; each worker makes a scheduler pass every 0.1 s (tests/settings.py).
    monkeypatch.setenv("VENTURI_TEST_PERIODIC", json.dumps([noop_every("* * * * * *")]))
    for _ in range(4):
        workers.start(alias, "--concurrency", "2")

    def ran() -> int:
        return Job.objects.using(alias).filter(state=venturi.State.COMPLETED).count()

    wait_until(lambda: ran() >= 5, timeout=60, message="five ticks to run")
    workers.stop_all()

    jobs = list(Job.objects.using(alias).order_by("periodic_tick"))
    ticks = [job.periodic_tick for job in jobs]
    assert all(tick is not None and tick.microsecond == 0 for tick in ticks)
    assert len(set(ticks)) == len(ticks) >= 5  # one job per tick
    assert all(earlier < later for earlier, later in itertools.pairwise(ticks))
    # Each job ran once, and each insert was made by exactly one worker.
    runs = Counter(Record.objects.using(alias).values_list("job_id", flat=True))
    completed = [job for job in jobs if job.state == venturi.State.COMPLETED]
    assert all(runs[job.id] == 1 for job in completed)
    assert all(runs[job_id] == 1 for job_id in runs)
    logs = "".join(workers.log(i) for i in range(4))
    assert all(logs.count(f"enqueued job {job.id} for tick") == 1 for job in jobs)
    inserting = sum(1 for i in range(4) if "enqueued job" in workers.log(i))
    assert inserting >= 1


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_tick_cleaned_up_before_fresh_workers_start_does_not_run_again(
    alias: str, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nightly job cleaned up before a deploy: the new workers do not run it again.

    tests.noop runs on 1 January only, so its latest tick is the same throughout;
    tests.pausing ticks every second and shows that the new workers make passes
    (it sorts after tests.noop, so a pass that enqueued it had decided tests.noop).
    """
    yearly = noop_every("0 0 1 1 *")
    marker = {"task": "tests.pausing", "cron": "* * * * * *", "payload": {"steps": 1}}
    monkeypatch.setenv("VENTURI_TEST_PERIODIC", json.dumps([yearly, marker]))
    seen_long_ago(alias)  # its latest tick, last 1 January, is caught up
    jobs = Job.objects.using(alias)
    workers.start(alias)
    wait_until(
        lambda: jobs.filter(kind="tests.noop", state=venturi.State.COMPLETED).exists(),
        timeout=60,
        message="the yearly tick to run",
    )
    workers.stop_all()
    (nightly,) = jobs.filter(kind="tests.noop")
    cleanup(older_than=timedelta(0), using=alias)
    assert not jobs.filter(kind="tests.noop").exists()
    after_cleanup = datetime.now(UTC)

    for _ in range(3):
        workers.start(alias, "--concurrency", "2")

    def new_ticks() -> int:
        return jobs.filter(
            kind="tests.pausing", periodic_tick__gt=after_cleanup, state=venturi.State.COMPLETED
        ).count()

    wait_until(lambda: new_ticks() >= 3, timeout=60, message="three new ticks to run")
    workers.stop_all()

    assert not jobs.filter(kind="tests.noop").exists()  # not enqueued again
    assert recorded(alias) == (nightly.periodic_tick, nightly.pk)
    logs = [workers.log(i) for i in range(1, 4)]
    assert not any("periodic tests.noop: enqueued" in log for log in logs)
    # Three workers, still one job per tick, each enqueued by one of them.
    ticks = list(jobs.filter(kind="tests.pausing").values_list("periodic_tick", flat=True))
    assert len(ticks) == len(set(ticks))
    for job_id in jobs.filter(kind="tests.pausing", periodic_tick__gt=after_cleanup).values_list(
        "id", flat=True
    ):
        assert sum(log.count(f"enqueued job {job_id} for tick") for log in logs) == 1
