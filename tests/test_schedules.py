"""Schedules you can act on: disabled in the database, run now, first seen, and the admin's page.

The scheduler's passes here are in-process (`Scheduler.run_pass` with a given
database time), on PostgreSQL and SQLite; one test runs real workers.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client, override_settings

import django_venturi as venturi
from django_venturi.checks import check_periodic
from django_venturi.models import Job, PeriodicTick, ScheduleState
from django_venturi.periodic import schedules
from django_venturi.registry import RegistrationError
from django_venturi.store.clock import database_time
from django_venturi.store.schedule_states import seen, set_enabled
from django_venturi.worker.scheduler import Scheduler
from tests.conftest import Workers, wait_until
from tests.test_admin import staff_with
from tests.test_periodic import declared, noop_every, recorded, seen_long_ago, with_periodic

START = datetime(2026, 5, 1, 10, 7, 30, tzinfo=UTC)
"""A pass's database time: the `*/5` schedule's latest tick is 10:05."""

PAGE = "/admin/django_venturi/periodictask/"

__all__ = ["declared"]  # the fixture


def at(hour: int, minute: int = 0, day: int = 1) -> datetime:
    return datetime(2026, 5, day, hour, minute, tzinfo=UTC)


# ------------------------------------------------------------ disabled schedules


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_disabled_schedule_is_skipped_and_runs_again_once_enabled(alias: str) -> None:
    seen_long_ago(alias)
    with with_periodic(noop_every("*/5 * * * *", timezone="UTC")):
        assert set_enabled(alias, "tests.noop", enabled=False, by="ada")
        assert not set_enabled(alias, "tests.noop", enabled=False, by="ada")  # already
        assert Scheduler(alias).run_pass(START) == []
        # Its tick is recorded as skipped: enabling it does not run the tick it missed.
        assert recorded(alias) == (at(10, 5), None)
        assert set_enabled(alias, "tests.noop", enabled=True, by="bob")
        assert Scheduler(alias).run_pass(START + timedelta(minutes=1)) == []
        (job_id,) = Scheduler(alias).run_pass(START + timedelta(minutes=3))
    assert Job.objects.using(alias).get(id=job_id).periodic_tick == at(10, 10)
    state = ScheduleState.objects.using(alias).get(kind="tests.noop")
    assert state.enabled and state.changed_by == "bob" and state.changed_at is not None


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_schedule_removed_and_added_back_keeps_its_state(alias: str) -> None:
    seen_long_ago(alias)
    set_enabled(alias, "tests.noop", enabled=False, by="ada")
    with with_periodic():  # removed from settings (a deploy)
        assert Scheduler(alias).run_pass(START) == []
    with with_periodic(noop_every("*/5 * * * *")):  # and back
        assert Scheduler(alias).run_pass(START + timedelta(minutes=5)) == []
    assert not Job.objects.using(alias).exists()
    assert not ScheduleState.objects.using(alias).get(kind="tests.noop").enabled


# ------------------------------------------------------------ first seen and catch-up


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_new_schedule_does_not_run_a_tick_from_before_it_was_first_seen(alias: str) -> None:
    """A nightly 02:00 schedule deployed at 10:00 runs at 02:00 the next night, not at 10:00."""
    with with_periodic(noop_every("0 2 * * *", timezone="UTC")):
        assert Scheduler(alias).run_pass(at(10)) == []
        assert recorded(alias) == (at(2), None)  # skipped
        assert ScheduleState.objects.using(alias).get(kind="tests.noop").first_seen_at == at(10)
        # Workers stopped from 01:00 to 09:00 the next day: that tick came after the
        # schedule was first seen, so it is caught up (PERIODIC_CATCH_UP is None).
        (job_id,) = Scheduler(alias).run_pass(at(9, day=2))
    assert Job.objects.using(alias).get(id=job_id).periodic_tick == at(2, day=2)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.parametrize(
    ("catch_up", "runs"), [(True, True), (9 * 3600, True), (timedelta(hours=1), False)]
)
def test_a_schedules_catch_up_decides_for_a_tick_from_before_it_was_first_seen(
    alias: str, catch_up: object, runs: bool
) -> None:
    with with_periodic(noop_every("0 2 * * *", timezone="UTC", catch_up=catch_up)):
        created = Scheduler(alias).run_pass(at(10))  # the 02:00 tick is eight hours late
    assert len(created) == (1 if runs else 0)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_schedules_catch_up_replaces_periodic_catch_up(alias: str) -> None:
    seen_long_ago(alias)
    entry = noop_every("*/30 * * * *", timezone="UTC", catch_up=timedelta(hours=1))
    with with_periodic(entry, PERIODIC_CATCH_UP=timedelta(minutes=1)):
        assert len(Scheduler(alias).run_pass(at(10, 29))) == 1  # 29 minutes late


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_schedule_with_a_recorded_tick_is_seen_since_that_tick(alias: str) -> None:
    """Upgraded from a version without ScheduleState: its missed ticks run as before."""
    PeriodicTick.objects.using(alias).create(kind="tests.noop", tick=at(2), job_id=None)
    with with_periodic(noop_every("0 2 * * *", timezone="UTC")):
        (job_id,) = Scheduler(alias).run_pass(at(9, day=2))
    assert Job.objects.using(alias).get(id=job_id).periodic_tick == at(2, day=2)
    assert ScheduleState.objects.using(alias).get(kind="tests.noop").first_seen_at == at(2)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_the_first_to_see_a_schedule_sets_when_it_was_first_seen(alias: str) -> None:
    assert seen(alias, "tests.noop", at(10)).first_seen_at == at(10)
    assert seen(alias, "tests.noop", at(11)).first_seen_at == at(10)
    assert seen(alias, "tests.noop").first_seen_at == at(10)
    assert ScheduleState.objects.using(alias).count() == 1


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_worker_that_meets_a_new_schedule_at_the_same_moment_as_another_reads_its_row(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between this worker's read (no row yet) and its insert, another inserts the row."""
    from django_venturi.store import schedule_states

    def time_after_another_worker_inserted(using: str) -> datetime:
        ScheduleState.objects.using(using).create(kind="tests.noop", first_seen_at=at(9))
        return at(10)

    monkeypatch.setattr(schedule_states, "database_time", time_after_another_worker_inserted)
    assert seen(alias, "tests.noop").first_seen_at == at(9)  # no IntegrityError: its row
    assert ScheduleState.objects.using(alias).count() == 1


def test_the_decorator_takes_a_catch_up(declared: None) -> None:
    @venturi.periodic("0 2 * * *", catch_up=timedelta(hours=3))
    @venturi.task(kind="tests.periodic_report")
    @dataclasses.dataclass
    class Report:
        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            return venturi.Outcome.completed()

    (schedule,) = schedules()
    assert schedule.catch_up == timedelta(hours=3)
    with pytest.raises(RegistrationError, match="catch_up must be a positive timedelta"):
        venturi.periodic("0 2 * * *", catch_up=timedelta(0))(Report)


@pytest.mark.parametrize("catch_up", [False, timedelta(0), "1h", -5])
def test_the_check_names_a_bad_catch_up(catch_up: object) -> None:
    with with_periodic(noop_every("0 2 * * *", catch_up=catch_up)):
        (error,) = check_periodic()
    assert error.id == "venturi.E044"
    assert "catch_up must be a positive timedelta, True or None" in error.msg


# ------------------------------------------------------------ the admin


def superuser_client() -> Client:
    User.objects.create_superuser("root", "root@example.com", "x")
    client = Client()
    client.login(username="root", password="x")
    return client


def logged(kind: str = "tests.noop") -> list[tuple[str, str]]:
    """The admin's log of the schedule: (user, message), oldest first."""
    entries = LogEntry.objects.filter(object_id=kind).order_by("id")
    return [(entry.user.get_username(), entry.get_change_message()) for entry in entries]


@pytest.mark.django_db
def test_run_now_enqueues_one_job_and_takes_no_tick() -> None:
    seen_long_ago("default")
    client = superuser_client()
    with with_periodic(noop_every("*/5 * * * *", timezone="UTC")):
        now = database_time("default")
        (ticked,) = Scheduler("default").run_pass(now)
        url = f"{PAGE}tests.noop/run/"
        confirmation = client.get(url)
        assert confirmation.status_code == 200
        assert "Run this schedule&#x27;s task now?" in confirmation.content.decode()
        assert Job.objects.count() == 1  # asking does nothing
        assert client.post(url).status_code == 302
        (ran,) = Job.objects.exclude(id=ticked)
        assert ran.periodic_tick is None and ran.payload == {"n": 1}
        assert ran.state == venturi.State.READY and ran.run_at <= database_time("default")
        # The tick it did not take: neither enqueued again, nor prevented.
        tick = PeriodicTick.objects.get(kind="tests.noop")
        assert tick.job_id == ticked
        assert Scheduler("default").run_pass(now) == []
        assert len(Scheduler("default").run_pass(now + timedelta(minutes=5))) == 1
    assert Job.objects.filter(periodic_tick__isnull=True).count() == 1
    assert logged() == [("root", f"Ran now: job #{ran.pk}.")]


@pytest.mark.django_db
def test_disable_and_enable_from_the_admin_are_stored_and_logged() -> None:
    client = superuser_client()
    with with_periodic(noop_every("*/5 * * * *", timezone="UTC")):
        assert client.post(f"{PAGE}tests.noop/disable/").status_code == 302
        state = ScheduleState.objects.get(kind="tests.noop")
        assert not state.enabled and state.changed_by == "root"
        page = client.get(PAGE).content.decode()
        assert "<strong>disabled</strong>" in page and "disabled by root" in page
        assert f"{PAGE}tests.noop/enable/" in page and f"{PAGE}tests.noop/disable/" not in page
        assert client.post(f"{PAGE}tests.noop/enable/").status_code == 302
    assert ScheduleState.objects.get(kind="tests.noop").enabled
    assert logged() == [("root", "Disabled."), ("root", "Enabled.")]


def action_urls() -> list[str]:
    return [f"{PAGE}tests.noop/{name}/" for name in ("run", "disable", "enable")]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("codenames", "allowed"),
    [
        (("view_periodictask", "manage_schedules"), True),
        (("view_periodictask",), False),
        (("manage_schedules",), False),
    ],
    ids=["with manage_schedules", "view only", "manage_schedules without view"],
)
def test_the_actions_need_manage_schedules_by_get_and_post(
    codenames: tuple[str, ...], allowed: bool
) -> None:
    client = staff_with(*codenames)
    with with_periodic(noop_every("*/5 * * * *", timezone="UTC")):
        for url in action_urls():
            assert client.get(url).status_code == (200 if allowed else 403), url
        for url in action_urls():
            assert client.post(url).status_code == (302 if allowed else 403), url
        page = client.get(PAGE)
    if "view_periodictask" in codenames:
        assert ("/run/" in page.content.decode()) is allowed
    assert Job.objects.exists() is allowed
    assert LogEntry.objects.exists() is allowed
    if not allowed:
        assert not ScheduleState.objects.filter(changed_by__gt="").exists()


@pytest.mark.django_db
def test_an_action_on_no_schedule_is_404_and_only_post_acts() -> None:
    client = superuser_client()
    with with_periodic(noop_every("*/5 * * * *", timezone="UTC")):
        assert client.get(f"{PAGE}tests.nothing/run/").status_code == 404
        assert client.post(f"{PAGE}tests.nothing/run/").status_code == 404
        assert client.put(f"{PAGE}tests.noop/run/").status_code == 405
        confirmation = client.get(f"{PAGE}tests.noop/disable/").content.decode()
    assert 'method="post"' in confirmation and "csrfmiddlewaretoken" in confirmation
    assert not Job.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.django_db
@override_settings(TIME_ZONE="Asia/Kolkata")
def test_the_page_shows_the_next_five_runs_in_the_sites_time_zone() -> None:
    client = superuser_client()
    with with_periodic(noop_every("0 2 * * *", timezone="UTC")):
        html = client.get(PAGE).content.decode()
    cell = html.split('class="venturi-next-runs">')[1].split("</td>")[0]
    runs = cell.split("<br>")
    assert len(runs) == 5
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d 07:30:00 IST", run) for run in runs), runs
    days = [datetime.fromisoformat(run[:10]) for run in runs]
    assert all(later - earlier == timedelta(days=1) for earlier, later in itertools.pairwise(days))
    assert "Times in Asia/Kolkata." in html


# ------------------------------------------------------------ a real worker


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_real_worker_skips_a_disabled_schedule_and_runs_an_enabled_one(
    alias: str, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    every_second = noop_every("* * * * * *")
    disabled = {"task": "tests.pausing", "cron": "* * * * * *", "payload": {"steps": 1}}
    monkeypatch.setenv("VENTURI_TEST_PERIODIC", json.dumps([every_second, disabled]))
    set_enabled(alias, "tests.pausing", enabled=False, by="ada")
    jobs = Job.objects.using(alias)
    ticks = PeriodicTick.objects.using(alias)

    def skipped_after_a_run() -> Any:
        """A tick of tests.pausing skipped after a tick of tests.noop ran."""
        ran = jobs.filter(kind="tests.noop", state=venturi.State.COMPLETED).first()
        return ran and ticks.filter(kind="tests.pausing", tick__gt=ran.periodic_tick).exists()

    workers.start(alias)
    wait_until(skipped_after_a_run, timeout=60, message="a pass past a run of tests.noop")
    assert not jobs.filter(kind="tests.pausing").exists()
    assert ticks.get(kind="tests.pausing").job_id is None
    assert "skipped: the schedule is disabled" in workers.log(0)

    set_enabled(alias, "tests.pausing", enabled=True, by="bob")  # while the worker runs
    wait_until(
        lambda: jobs.filter(kind="tests.pausing", state=venturi.State.COMPLETED).exists(),
        timeout=60,
        message="tests.pausing to run once enabled",
    )
    workers.stop_all()
