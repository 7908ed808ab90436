"""The documentation's examples (docs/examples/), run as the docs say, so that they cannot rot.

Each page of the docs site shows these functions and tasks with `literalinclude`;
here they run against the PostgreSQL test database, and real `venturi_worker`
subprocesses (which import them through VENTURI["TASK_MODULES"]), mostly with
`--burst`, run the jobs they enqueue. The testing how-to's example is a test
module of its own, run by tests/test_docs_testing_example.py.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import django
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.test import Client, RequestFactory, override_settings
from django.urls import reverse
from django.utils import timezone

import django_venturi as venturi
from django_venturi.checks import check_periodic
from django_venturi.models import Job
from django_venturi.periodic import _declared, schedules
from django_venturi.signals import job_finished
from django_venturi.tasks_backend import frameworks
from django_venturi.testing import drain
from django_venturi.worker.process import Worker
from django_venturi.worker.scheduler import Scheduler
from docs.examples import (
    admin_groups,
    autoscaling,
    dedup,
    enqueueing,
    flow_control,
    long_running,
    outcomes,
    payloads,
    periodic,
    quickstart,
    scheduling,
    workflows,
)
from tests.conftest import ROOT, Workers, vanished_run, wait_until
from tests.test_periodic import seen_long_ago

pytestmark = pytest.mark.django_db(transaction=True)

# Importing docs.examples.periodic declared its schedules: take them out at once, so that
# no other test of the suite sees them; `periodic_schedules` puts them back for a test.
PERIODIC_SCHEDULES = {
    kind: _declared.pop(kind) for kind in ("docs.morning_report", "docs.deactivate_idle_users")
}


def journal(job: Job) -> list[str]:
    return list(job.journal.order_by("id").values_list("outcome", flat=True))


class Rollback(Exception):
    pass


def test_quick_start_commits_the_user_and_the_job_together(workers: Workers) -> None:
    user = quickstart.sign_up("ada@example.com")
    job = Job.objects.get(kind="docs.send_welcome_email")
    assert job.payload == {"user_id": user.pk} and job.state == venturi.State.READY

    with pytest.raises(Rollback), transaction.atomic():
        quickstart.sign_up("bob@example.com")
        raise Rollback
    assert not User.objects.filter(username="bob@example.com").exists()
    assert Job.objects.count() == 1

    workers.burst("default")
    job.refresh_from_db()
    assert job.state == venturi.State.COMPLETED, job.last_error
    assert journal(job) == ["completed"]


def test_payload_types_round_trip_and_a_bad_payload_names_its_field(workers: Workers) -> None:
    order = payloads.ShipOrder(
        order_id=UUID(int=7),
        lines=[payloads.Line("tea", 2, Decimal("4.50"))],
        carrier=payloads.Carrier.COURIER,
        partner_token="s3cret",
    )
    job = order.enqueue()
    assert job.queue == "shipping"
    assert job.decoded_payload() == order
    assert "s3cret" not in str(job.masked_payload())
    empty = payloads.ShipOrder(order_id=UUID(int=8), lines=[], carrier=payloads.Carrier.POST)
    empty_job = empty.enqueue()

    message = payloads.enqueue_a_bad_order()
    assert message == "ShipOrder.lines[1].quantity: expected int, got str"
    assert Job.objects.count() == 2  # the bad order wrote nothing

    workers.burst("default")
    job.refresh_from_db()
    empty_job.refresh_from_db()
    assert job.state == venturi.State.COMPLETED, job.last_error
    assert empty_job.state == venturi.State.FAILED
    assert "has nothing to ship" in empty_job.last_error and journal(empty_job) == ["failed"]


def test_every_way_to_enqueue(workers: Workers) -> None:
    users = [User.objects.create_user(username=f"user{i}") for i in range(3)]
    first = users[0].pk

    job = enqueueing.deactivate(first)
    assert job.state == venturi.State.READY and job.queue == "emails"
    assert not User.objects.get(pk=first).is_active

    with pytest.raises(Rollback), transaction.atomic():
        enqueueing.charge(first, 500)
        assert Job.objects.count() == 1  # not yet: the transaction is open
        raise Rollback
    assert Job.objects.count() == 1  # rolled back: never written
    enqueueing.charge(first, 500)
    assert Job.objects.filter(payload={"user_id": first, "amount_cents": 500}).exists()

    many = enqueueing.send_all_receipts([user.pk for user in users])
    assert [j.payload["user_id"] for j in many] == [user.pk for user in users]
    assert {j.priority for j in many} == {venturi.Priority.LOW}

    later = enqueueing.remind_later(first)
    assert later.queue == "reminders" and later.priority == venturi.Priority.HIGH
    later.refresh_from_db()
    assert later.run_at > timezone.now() + timedelta(minutes=59)

    from_async = async_to_sync(enqueueing.receipt_from_webhook)(first, 250)
    assert from_async.state == venturi.State.READY

    workers.burst("default")
    states = dict(Job.objects.values_list("id", "state"))
    assert states.pop(later.id) == venturi.State.READY  # due in an hour
    assert set(states.values()) == {venturi.State.COMPLETED}
    assert len(states) == 1 + 1 + 3 + 1


def test_outcomes_retry_fail_and_complete(workers: Workers) -> None:
    active = User.objects.create_user(username="active")
    inactive = User.objects.create_user(username="inactive", is_active=False)
    done = outcomes.WelcomeWhenActive(user_id=active.pk).enqueue()
    waiting = outcomes.WelcomeWhenActive(user_id=inactive.pk).enqueue()
    missing = outcomes.WelcomeWhenActive(user_id=10_000).enqueue()

    workers.burst("default")
    for job in (done, waiting, missing):
        job.refresh_from_db()
    assert done.state == venturi.State.COMPLETED
    assert missing.state == venturi.State.FAILED and journal(missing) == ["failed"]
    assert "no user #10000" in missing.last_error
    assert waiting.state == venturi.State.READY and journal(waiting) == ["retry"]
    assert waiting.failures == 1
    assert waiting.run_at > timezone.now() + timedelta(minutes=9)


def test_a_paused_export_resumes_from_its_carry(workers: Workers) -> None:
    for i in range(5):
        User.objects.create_user(username=f"export{i}")
    job = outcomes.ExportUsers(batch=2, batches_per_run=1).enqueue()

    workers.burst("default")
    job.refresh_from_db()
    assert job.state == venturi.State.COMPLETED, job.last_error
    assert journal(job) == ["paused", "paused", "paused", "completed"]
    assert job.failures == 0 and job.carry["exported"] == 5


def test_rate_limits_and_pausing(workers: Workers) -> None:
    acme = [
        flow_control.ChargeAccount(account_id="acme", amount_cents=n).enqueue() for n in range(7)
    ]
    globex = flow_control.ChargeAccount(account_id="globex", amount_cents=1).enqueue()
    flow_control.partner_outage_started()
    assert flow_control.what_is_paused() == ["kind docs.charge_account by on-call"]
    workers.burst("default")  # nothing of a paused kind is claimed: the burst ends at once
    assert set(Job.objects.values_list("state", flat=True)) == {venturi.State.READY}

    flow_control.partner_outage_over()
    assert flow_control.what_is_paused() == []
    # acme's limit is 5 a second: a burst worker waits for the window, then runs the rest.
    workers.burst("default")
    jobs = Job.objects.filter(pk__in=[job.pk for job in [*acme, globex]])
    assert set(jobs.values_list("state", flat=True)) == {venturi.State.COMPLETED}
    assert not jobs.filter(failures__gt=0).exists()
    starts = sorted(
        Job.objects.filter(pk__in=[job.pk for job in acme]).values_list("started_at", flat=True)
    )
    assert starts[5] - starts[0] >= timedelta(seconds=1)


def test_fair_queues_share_claims_by_weight() -> None:
    scheduling.import_spreadsheet(300)
    venturi.enqueue_many([enqueueing.SendReceipt(user_id=i, amount_cents=1) for i in range(8)])
    with override_settings(VENTURI={**settings.VENTURI, **scheduling.FAIR_QUEUES}):
        ran = drain()
    assert len(ran) == 308
    receipt = "docs.send_receipt"
    # The import was first (its jobs are older); then four receipts per import row.
    assert [run.kind == receipt for run in ran[:10]] == [False, *[True] * 4, False, *[True] * 4]


def test_accounts_take_turns_so_a_big_import_holds_back_no_small_one() -> None:
    scheduling.import_contacts("acme", 300)
    small = {
        job.pk
        for account in ("globex", "hooli", "initech")
        for job in scheduling.import_contacts(account, 1)
    }
    ran = drain()
    assert len(ran) == 303
    # One claim (100 places, four accounts): the three small imports are in it.
    assert {run.job_id for run in ran[:100]} >= small


def test_a_cap_per_account_holds_while_a_worker_drains(workers: Workers) -> None:
    assert scheduling.SyncAccount.venturi_spec.concurrency == venturi.Concurrency(  # type: ignore[attr-defined]
        2, key="account_id"
    )
    pages = [("acme", page) for page in range(6)] + [("globex", page) for page in range(2)]
    venturi.enqueue_many([scheduling.SyncAccount(account_id=a, page=p) for a, p in pages])
    workers.burst("default", "--concurrency", "8")
    jobs = Job.objects.filter(kind="docs.sync_account")
    assert set(jobs.values_list("state", flat=True)) == {venturi.State.COMPLETED}
    for account in ("acme", "globex"):
        # A place is held from the claim (started_at) to the verdict (finished_at).
        held = jobs.filter(payload__account_id=account).values_list("started_at", "finished_at")
        events = sorted([(start, 1) for start, _ in held] + [(end, -1) for _, end in held])
        running = [sum(change for _, change in events[: index + 1]) for index in range(len(events))]
        assert max(running) <= 2, account


def test_the_scheduling_example_runs_urgent_reports_and_leaves_the_rest(workers: Workers) -> None:
    urgent, *later = scheduling.schedule_reports([1, 2, 3])
    assert urgent.priority == venturi.Priority.HIGH and urgent.queue == "reports"
    assert {job.priority for job in later} == {venturi.Priority.LOW}
    other = enqueueing.SendReceipt(user_id=1, amount_cents=1).enqueue()

    workers.burst("default", "--queues", "reports")
    urgent.refresh_from_db()
    other.refresh_from_db()
    assert urgent.state == venturi.State.COMPLETED
    assert other.state == venturi.State.READY  # the "emails" queue is not served
    delayed = Job.objects.filter(pk__in=[job.pk for job in later])
    assert set(delayed.values_list("state", flat=True)) == {venturi.State.READY}


def test_dedup_folds_requests_into_one_job(workers: Workers) -> None:
    jobs = [dedup.RecomputeScore(user_id=7).enqueue() for _ in range(3)]
    assert len({job.pk for job in jobs}) == 1
    job = jobs[-1]
    assert job.merged_count == 2 and job.payload == {"user_id": 7, "requests": 3}
    other = dedup.RecomputeScore(user_id=8).enqueue()
    assert other.pk != job.pk

    workers.burst("default")
    job.refresh_from_db()
    assert job.state == venturi.State.COMPLETED
    assert dedup.RecomputeScore(user_id=7).enqueue().pk != job.pk  # a finished job frees its key


def test_operations_history_signals_health_and_cleanup() -> None:
    # Imported here: importing it connects the example's signal receiver, for this test only.
    from docs.examples import operations

    User.objects.create_user(username="ok")
    outcomes.WelcomeWhenActive(user_id=User.objects.get().pk).enqueue()
    outcomes.WelcomeWhenActive(user_id=10_001).enqueue()
    try:
        Worker(burst=True, concurrency=2, poll_interval=0.05).run()
    finally:
        job_finished.disconnect(dispatch_uid="docs.examples.count_outcomes")
    assert operations.outcomes == {
        ("docs.welcome_when_active", "completed"): 1,
        ("docs.welcome_when_active", "failed"): 1,
    }
    [failure] = operations.recent_failures()
    assert "(docs.welcome_when_active) attempt 1: no user #10001" in failure

    response = operations.queue_health(RequestFactory().get("/health"))
    assert response.status_code == 200, response.content
    stale = enqueueing.SendReceipt(user_id=1, amount_cents=1).enqueue(
        run_at=timezone.now() - timedelta(minutes=10)
    )
    response = operations.queue_health(RequestFactory().get("/health"))
    assert response.status_code == 503
    assert "queue 'emails': the oldest due job has waited" in response.content.decode()

    assert operations.purge_finished_jobs().jobs == 0  # finished just now: kept
    Job.objects.exclude(pk=stale.pk).update(finished_at=timezone.now() - timedelta(days=8))
    result = operations.purge_finished_jobs()
    assert (result.jobs, result.journal_entries) == (2, 2)
    assert list(Job.objects.values_list("pk", flat=True)) == [stale.pk]


# ---------------------------------------------------------------- long-running jobs


def test_an_import_reports_its_progress_and_completes(workers: Workers) -> None:
    job = long_running.ImportRows(source="small.csv", rows=20).enqueue()
    workers.burst("default")
    assert long_running.import_status(job.pk) == {
        "state": venturi.State.COMPLETED,
        "done": 20,
        "total": 20,
        "cancelling": False,
    }
    job.refresh_from_db()
    assert journal(job) == ["completed"] and job.progress["note"] == "small.csv"


def test_cancelling_imports_stops_the_running_one_and_the_waiting_one(workers: Workers) -> None:
    running = long_running.ImportRows(source="big.csv", rows=100_000).enqueue()
    waiting = long_running.ImportRows(source="big.csv", rows=10).enqueue(delay=timedelta(hours=1))
    other = long_running.ImportRows(source="other.csv", rows=10).enqueue(delay=timedelta(hours=1))
    workers.start("default")
    # Progress is written at most once a second while the job runs.
    wait_until(lambda: long_running.import_status(running.pk)["done"] > 0, message="progress")
    status = long_running.import_status(running.pk)
    assert status["state"] == venturi.State.RUNNING and status["total"] == 100_000

    result = long_running.cancel_imports("big.csv")

    assert result == venturi.CancelResult(cancelled=1, stopping=1)
    status = long_running.import_status(running.pk)
    assert status["cancelling"] or status["state"] == venturi.State.CANCELLED
    wait_until(
        lambda: Job.objects.get(pk=running.pk).state == venturi.State.CANCELLED,
        message="the running import to stop",
    )
    running.refresh_from_db()
    assert journal(running) == ["cancelled"]  # it returned `paused`; the cancel wins
    assert 0 < running.progress["done"] < 100_000
    waiting.refresh_from_db()
    other.refresh_from_db()
    assert (waiting.state, journal(waiting)) == (venturi.State.CANCELLED, [])
    assert other.state == venturi.State.READY


def test_an_import_checkpoints_when_its_timeout_asks_it_to_stop() -> None:
    assert long_running.ImportRows.venturi_spec.timeout == timedelta(minutes=10)  # type: ignore[attr-defined]

    def context(*, carry: Any, timed_out: bool, reported: list[dict[str, Any]]) -> venturi.Context:
        timeout = threading.Event()
        if timed_out:
            timeout.set()
        return venturi.Context(
            job_id=1,
            attempt=2,
            carry=carry,
            enqueued_at=timezone.now(),
            database="default",
            stop=threading.Event(),
            lease_lost=threading.Event(),
            heartbeat=lambda: True,
            timed_out=timeout,
            on_progress=reported.append,
        )

    task = long_running.ImportRows(source="a.csv", rows=10)
    # The run passed its timeout: it pauses at the row it was on (within TIMEOUT_GRACE, its
    # own outcome stands: the job is ready again, not failed).
    stopped = context(carry=long_running.Position(next_row=7), timed_out=True, reported=[])
    assert task.handle(stopped) == venturi.Outcome.paused(long_running.Position(next_row=7))
    # The next run resumes from the checkpoint.
    reported: list[dict[str, Any]] = []
    resumed = context(carry=long_running.Position(next_row=7), timed_out=False, reported=reported)
    assert task.handle(resumed) == venturi.Outcome.completed()
    assert [(p["done"], p["total"], p["note"]) for p in reported] == [
        (8, 10, "a.csv"),
        (9, 10, "a.csv"),
        (10, 10, "a.csv"),
    ]


# ---------------------------------------------------------------- periodic jobs


@pytest.fixture
def periodic_schedules() -> Iterator[None]:
    """The decorator schedules of docs.examples.periodic, declared for one test."""
    _declared.update(PERIODIC_SCHEDULES)
    yield
    for kind in PERIODIC_SCHEDULES:
        _declared.pop(kind, None)


def seen_since_2000(*kinds: str) -> None:
    """Schedules that ran before the stories below begin: their missed ticks are caught up
    (a schedule first seen during a story would skip its ticks from before)."""
    for kind in kinds or PERIODIC_SCHEDULES_AND_SETTINGS:
        seen_long_ago("default", kind)


PERIODIC_SCHEDULES_AND_SETTINGS = (
    "docs.morning_report",
    "docs.deactivate_idle_users",
    "docs.clear_sessions",
)


def settings_of_the_example() -> override_settings:
    return override_settings(VENTURI={**settings.VENTURI, **periodic.VENTURI})


def test_periodic_schedules_from_decorators_and_settings(periodic_schedules: None) -> None:
    declared = {schedule.kind: schedule for schedule in schedules()}
    morning = declared["docs.morning_report"]
    assert (morning.cron, morning.zone) == ("0 7 * * 1-5", ZoneInfo("Europe/Paris"))
    assert morning.instance() == periodic.MorningReport(recipients="managers")
    idle = declared["docs.deactivate_idle_users"]
    assert idle.zone == ZoneInfo(settings.TIME_ZONE)
    assert idle.instance() == periodic.DeactivateIdleUsers(idle_days=90)
    assert check_periodic() == []

    with settings_of_the_example():
        assert check_periodic() == []
        merged = {schedule.kind: schedule for schedule in schedules()}
    assert set(merged) == {
        "docs.clear_sessions",
        "docs.morning_report",
        "docs.deactivate_idle_users",
    }
    morning = merged["docs.morning_report"]  # the settings entry replaced the decorator
    assert (morning.cron, morning.origin) == ("30 6 * * *", "VENTURI['PERIODIC'][1]")
    assert morning.instance() == periodic.MorningReport(recipients="everyone")

    typo = {"task": "docs.clear_session", "cron": "30 2 * * *"}
    with override_settings(VENTURI={**settings.VENTURI, "PERIODIC": [typo]}):
        (error,) = check_periodic()
    assert error.id == "venturi.E044"
    assert error.msg == "VENTURI['PERIODIC'][0]: no task is registered under 'docs.clear_session'"


def ticks(kind: str) -> list[datetime]:
    jobs = Job.objects.filter(kind=kind).order_by("periodic_tick")
    assert all(job.run_at == job.periodic_tick for job in jobs)
    return [job.periodic_tick.astimezone(UTC) for job in jobs if job.periodic_tick]


def passes(scheduler: Scheduler, start: datetime, end: datetime) -> None:
    """A worker's scheduler passes, once a minute (every PERIODIC_INTERVAL in real life)."""
    while start < end:
        scheduler.run_pass(start)
        start += timedelta(minutes=1)


def test_missed_ticks_are_not_replayed_and_old_ones_are_skipped(periodic_schedules: None) -> None:
    # No worker ran from Friday evening; one starts on Monday 4 May 2026 at 09:00 in Paris.
    monday = datetime(2026, 5, 4, 7, 0, tzinfo=UTC)
    seen_since_2000()
    with settings_of_the_example():
        assert len(Scheduler("default").run_pass(monday)) == 2
        assert Scheduler("default").run_pass(monday) == []  # another worker: nothing to do
    # Only the latest tick of each schedule: 06:30 in Paris, and 09:00 UTC ...
    assert ticks("docs.morning_report") == [datetime(2026, 5, 4, 4, 30, tzinfo=UTC)]
    assert ticks("docs.deactivate_idle_users") == [monday]
    # ... but 02:30 in Paris is six and a half hours late: past PERIODIC_CATCH_UP, skipped.
    assert ticks("docs.clear_sessions") == []


def test_a_nightly_tick_runs_once_across_daylight_saving_changes(periodic_schedules: None) -> None:
    with settings_of_the_example():
        scheduler = Scheduler("default")
        # 29 March 2026: 02:00 becomes 03:00 in Paris, so 02:30 never happens.
        passes(
            scheduler, datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 29, 12, tzinfo=UTC)
        )
        # 25 October 2026: 03:00 becomes 02:00 in Paris, so 02:30 happens twice.
        passes(
            scheduler,
            datetime(2026, 10, 24, 12, tzinfo=UTC),
            datetime(2026, 10, 25, 12, tzinfo=UTC),
        )
    paris = ZoneInfo("Europe/Paris")
    assert [tick.astimezone(paris).isoformat() for tick in ticks("docs.clear_sessions")] == [
        "2026-03-29T03:00:00+02:00",  # at the shift
        "2026-10-25T02:30:00+02:00",  # the first 02:30 only
    ]


def test_the_repeated_autumn_hour_runs_each_tick_once(periodic_schedules: None) -> None:
    """What the periodic how-to says of the hour repeated in autumn (docs/howto/periodic.md,
    daylight saving): on 25 October 2026, 03:00 becomes 02:00 in Paris."""
    # An hourly schedule runs in both passes of the hour.
    hourly = {"task": "docs.deactivate_idle_users", "cron": "0 * * * *", "timezone": "Europe/Paris"}
    entry = {**hourly, "payload": {"idle_days": 90}}
    seen_since_2000()
    with override_settings(VENTURI={**settings.VENTURI, "PERIODIC": [entry]}):
        passes(
            Scheduler("default"),
            datetime(2026, 10, 24, 23, 30, tzinfo=UTC),
            datetime(2026, 10, 25, 2, 30, tzinfo=UTC),
        )
    assert ticks("docs.deactivate_idle_users") == [
        datetime(2026, 10, 24, 23, 0, tzinfo=UTC),  # 01:00 CEST
        datetime(2026, 10, 25, 0, 0, tzinfo=UTC),  # 02:00 CEST
        datetime(2026, 10, 25, 1, 0, tzinfo=UTC),  # 02:00 CET
        datetime(2026, 10, 25, 2, 0, tzinfo=UTC),  # 03:00 CET
    ]

    # A nightly 02:30 runs once, in the first pass: in the second, its latest tick is
    # still that one, not the previous day's, even when that day's job was cleaned up
    # and PERIODIC_CATCH_UP (None here) would let it run again.
    nightly = {"task": "docs.clear_sessions", "cron": "30 2 * * *", "timezone": "Europe/Paris"}
    night = (datetime(2026, 10, 25, 0, tzinfo=UTC), datetime(2026, 10, 25, 2, tzinfo=UTC))
    with override_settings(VENTURI={**settings.VENTURI, "PERIODIC": [nightly]}):
        scheduler = Scheduler("default")
        scheduler.run_pass(datetime(2026, 10, 24, 12, tzinfo=UTC))  # the 24th's 02:30
        Job.objects.filter(kind="docs.clear_sessions").delete()  # cleaned up since
        passes(scheduler, *night)
        # A worker that starts during the second pass, with no memory of the ticks.
        Scheduler("default").run_pass(datetime(2026, 10, 25, 1, 10, tzinfo=UTC))
    assert ticks("docs.clear_sessions") == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC)]


def test_a_worker_enqueues_and_runs_the_latest_tick_of_each_schedule(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This worker, and no other of the suite, imports the module and so declares its schedules.
    modules = [*settings.VENTURI["TASK_MODULES"], "docs.examples.periodic"]
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps({"TASK_MODULES": modules}))
    idle = User.objects.create_user("idle", last_login=timezone.now() - timedelta(days=100))
    kinds = {"docs.morning_report", "docs.deactivate_idle_users"}
    seen_since_2000(*kinds)

    def completed() -> set[str]:
        return set(Job.objects.filter(state=venturi.State.COMPLETED).values_list("kind", flat=True))

    workers.start("default")
    wait_until(lambda: completed() >= kinds, timeout=60, message="both schedules to run")
    workers.stop_all()

    for kind in kinds:
        assert ticks(kind), kind  # a tick in the past (last Friday's 07:00, perhaps): caught up
    idle.refresh_from_db()
    assert not idle.is_active
    assert "periodic docs.morning_report: enqueued job" in workers.log()


# ---------------------------------------------------------------- the admin


def test_admin_groups_give_each_page_and_action_its_permission() -> None:
    admin_groups.create_admin_groups()
    admin_groups.create_admin_groups()  # again: nothing changes
    assert Group.objects.get(name="Ops").permissions.count() == len(admin_groups.OPS)
    with pytest.raises(LookupError, match="no django_venturi permission view_jobs"):
        admin_groups.grant("Ops", ["view_jobs"])

    failed = outcomes.WelcomeWhenActive(user_id=10_002).enqueue()
    Worker(burst=True, concurrency=1, poll_interval=0.05).run()
    waiting = enqueueing.SendReceipt(user_id=1, amount_cents=1).enqueue(delay=timedelta(hours=1))

    def member_of(group: str) -> Client:
        user = User.objects.create_user(group.lower(), is_staff=True)  # the admin needs is_staff
        user.groups.add(Group.objects.get(name=group))
        client = Client()
        client.force_login(user)
        return client

    ops, support = member_of("Ops"), member_of("Support")
    changelist = reverse("admin:django_venturi_job_changelist")
    cleanup = reverse("admin:django_venturi_job_cleanup")
    for client in (ops, support):
        for name in ("job_stats", "journalentry_changelist", "periodictask_changelist"):
            assert client.get(reverse(f"admin:django_venturi_{name}")).status_code == 200, name
        page = client.get(reverse("admin:django_venturi_job_change", args=[failed.pk]))
        assert "Journal (one entry per run)" in page.content.decode()
    listing = {client: client.get(changelist).content.decode() for client in (ops, support)}
    for action in ("retry_now", "cancel_jobs", "delete_selected"):
        assert f'value="{action}"' in listing[ops]
        assert (f'value="{action}"' in listing[support]) == (action == "retry_now")
    assert cleanup in listing[ops] and cleanup not in listing[support]
    assert (ops.get(cleanup).status_code, support.get(cleanup).status_code) == (200, 403)
    pause = reverse("admin:django_venturi_job_pause")
    stats = {
        client: client.get(reverse("admin:django_venturi_job_stats")) for client in (ops, support)
    }
    assert f'action="{pause}"' in stats[ops].content.decode()
    assert f'action="{pause}"' not in stats[support].content.decode()

    def act(client: Client, action: str, job: Job) -> None:
        data = {"action": action, "_selected_action": [job.pk], "post": "yes"}
        client.post(changelist, data)

    act(support, "retry_now", failed)
    act(ops, "cancel_jobs", waiting)
    failed.refresh_from_db()
    waiting.refresh_from_db()
    assert (failed.state, waiting.state) == (venturi.State.READY, venturi.State.CANCELLED)

    # view_job alone: the job's page leaves the journal out.
    viewer = User.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(
        *Group.objects.get(name="Ops").permissions.filter(codename="view_job")
    )
    client = Client()
    client.force_login(viewer)
    page = client.get(reverse("admin:django_venturi_job_change", args=[failed.pk]))
    assert page.status_code == 200 and "Journal (one entry per run)" not in page.content.decode()


# ---------------------------------------------------------------- Django's Tasks framework


@pytest.mark.skipif(
    not frameworks.available(),
    reason="no Tasks framework: Django 5.2 without the django-tasks backport",
)
def test_django_tasks_enqueue_run_and_read_back(workers: Workers) -> None:
    from django_venturi.tasks_backend.backend import check_tasks_setting
    from docs.examples import django_tasks as example

    # Django 6 takes its own framework; Django 5.2 the backport, installed by the `test` extra.
    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    framework = frameworks.of_task(example.send_invoice)
    assert framework is not None and framework.name == expected
    with override_settings(TASKS=example.TASKS):
        assert check_tasks_setting() == []

    user = User.objects.create_user("ada", email="ada@example.com")
    with pytest.raises(RuntimeError), transaction.atomic():
        example.close_account(user.pk, 4200)
        raise RuntimeError("roll back")
    assert not Job.objects.exists()

    result_id = example.close_account(user.pk, 4200)
    job = Job.objects.get(pk=int(result_id))
    assert (job.kind, job.queue) == ("tasks:docs.examples.django_tasks.send_invoice", "emails")
    assert (job.priority, job.rank) == (venturi.Priority.HIGH, -10)
    assert example.invoice_status(result_id) == "ready"
    lower = example.send_invoice.using(priority=-20).enqueue(user.pk, 100)
    assert Job.objects.filter(pk=int(lower.id), priority=venturi.Priority.LOW, rank=20).exists()
    missing = example.send_invoice.enqueue(10_003, 100)

    workers.burst("default")

    assert example.invoice_status(result_id) == "sent to ada@example.com"
    assert example.invoice_status(str(missing.id)) == (
        "failed after 1 run(s): django.contrib.auth.models.User.DoesNotExist"
    )
    completed = venturi.history(kind=job.kind, outcome=venturi.JournalOutcome.COMPLETED)
    assert {entry.job_id for entry in completed} == {int(lower.id), int(result_id)}


def test_workflows_run_in_order_and_pass_results_on(workers: Workers) -> None:
    fetch, index = workflows.crawl("https://example.com/a")
    assert (fetch.state, index.state) == (venturi.State.READY, venturi.State.WAITING)
    chained = workflows.crawl_chained("https://example.com/b")
    workers.burst("default")

    for job in (fetch, index, *chained):
        job.refresh_from_db()
        assert job.state == venturi.State.COMPLETED
    assert index.result == {"indexed": len("<h1>https://example.com/a</h1>")}
    assert index.started_at > fetch.finished_at


def test_a_group_reports_once_after_every_member(workers: Workers) -> None:
    ops, dev = Group.objects.create(name="ops"), Group.objects.create(name="dev")
    for name, groups in (("ada", [ops, dev]), ("bob", [dev])):
        User.objects.create(username=name).groups.set(groups)
    counts, report = workflows.report_all_groups()
    assert len(counts) == 2
    workers.burst("default", "--concurrency", "4")

    report.refresh_from_db()
    assert report.state == venturi.State.COMPLETED and report.result == {"total": 3}
    assert journal(report) == ["completed"]


def test_an_atomic_handler_commits_its_writes_with_its_job(workers: Workers) -> None:
    owner = User.objects.create(username="ada")
    job = workflows.OpenTeam(name="ops", owner_id=owner.pk).enqueue()
    workers.burst("default")

    job.refresh_from_db()
    team = Group.objects.get(name="ops")
    assert job.state == venturi.State.COMPLETED and job.result == team.pk
    assert list(owner.groups.all()) == [team]


def test_the_autoscaling_query_counts_the_claimable_backlog_of_its_queue() -> None:
    due = [quickstart.SendWelcomeEmail(user_id=n).enqueue() for n in range(3)]
    quickstart.SendWelcomeEmail(user_id=9).enqueue(delay=timedelta(hours=1))  # not yet due
    enqueueing.SendReceipt(user_id=1, amount_cents=1).enqueue()  # another queue
    quickstart.SendWelcomeEmail(user_id=10).enqueue(after=[due[0]])  # waiting
    Job.objects.filter(pk=due[2].pk).update(
        **vanished_run(
            lease_expires_at=timezone.now() + timedelta(minutes=5), started_at=timezone.now()
        )
    )  # running
    assert autoscaling.backlog() == 2

    venturi.pause(kind="docs.send_welcome_email")
    assert autoscaling.backlog() == 0
    venturi.resume(kind="docs.send_welcome_email")
    venturi.pause(queue="default")
    assert autoscaling.backlog() == 0
    venturi.resume(queue="default")
    assert autoscaling.backlog() == 2


def test_the_guides_scaled_object_polls_the_tested_query() -> None:
    guide = (ROOT / "docs" / "guide.md").read_text()
    yaml = guide[guide.index("- type: postgresql") :]
    folded = yaml[yaml.index("query: >-") + len("query: >-") : yaml.index("targetQueryValue")]

    def words(sql: str) -> str:
        return re.sub(r"\( | \)", lambda m: m[0].strip(), " ".join(sql.split()))

    assert words(folded) == words(autoscaling.BACKLOG_QUERY)
