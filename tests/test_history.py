"""History roll-ups: workers' figures per minute, one worker's chores a minute, hours, pruning."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Sum
from django.test import override_settings

from django_venturi.checks import check_settings
from django_venturi.models import HISTOGRAM_BUCKETS, RUN_COLUMNS, HistoryRollup, Job
from django_venturi.states import JournalOutcome, State
from django_venturi.store import history
from django_venturi.store.claim_types import ClaimedJob
from django_venturi.store.verdicts import Verdict
from django_venturi.worker import history as worker_history
from django_venturi.worker.process import Worker
from tests.conftest import in_thread, result_of, wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

MINUTE = HistoryRollup.Span.MINUTE
HOUR = HistoryRollup.Span.HOUR
T0 = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


def figures(completed: int = 0, failed: int = 0, retried: int = 0, bucket: int = 0) -> list[int]:
    values = [completed, failed, retried] + [0] * (2 * HISTOGRAM_BUCKETS)
    values[history.RUN_OFFSET + bucket] = completed + failed + retried
    return values


def test_a_time_falls_in_its_log_scale_bucket() -> None:
    assert history.bucket(0.0) == 0
    assert history.bucket(0.0009) == 0
    assert history.bucket(0.001) == 1  # [1, 2) ms
    assert history.bucket(0.003) == 2  # [2, 4) ms
    assert history.bucket(1.0) == 10  # [512, 1024) ms
    assert history.bucket(-5.0) == 0  # a clock step back: never a negative bucket
    assert history.bucket(10**9) == HISTOGRAM_BUCKETS - 1


def test_a_worker_counts_each_run_in_the_stores_buckets() -> None:
    times = [-1.0, 0.0, 0.0005, 0.001, 0.0019, 0.002, 0.5, 1.0, 3600.0, 10**9]
    due = datetime.now(UTC)
    verdicts = [
        Verdict(
            job=ClaimedJob(
                id=index,
                kind="k",
                queue="q",
                priority=1,
                payload=None,
                carry=None,
                attempt=1,
                failures=0,
                enqueued_at=due,
                started_at=due + timedelta(seconds=max(seconds, 0.0)),
                claim_token=uuid.uuid4(),
                lease=timedelta(minutes=5),
                run_at=due,
            ),
            outcome=JournalOutcome.COMPLETED,
            state=State.COMPLETED,
            duration=seconds,
        )
        for index, seconds in enumerate(times)
    ]
    counted = worker_history.MinuteFigures()
    counted.record(verdicts)
    [(key, values)] = counted.take_changed().items()
    expected = [0] * HISTOGRAM_BUCKETS
    for seconds in times:
        expected[history.bucket(seconds)] += 1
    assert values[: history.WAIT_OFFSET] == [len(times), 0, 0]
    assert values[history.RUN_OFFSET :] == expected
    assert values[history.WAIT_OFFSET : history.RUN_OFFSET] == expected
    assert key[1:] == ("q", "k") and key[0].second == 0


def test_percentiles_come_from_summed_buckets() -> None:
    buckets = [0] * HISTOGRAM_BUCKETS
    buckets[history.bucket(0.0015)] = 90  # 90 runs of 1-2 ms
    buckets[history.bucket(1.5)] = 10  # 10 runs of 1.024-2.048 s
    p50 = history.percentile(buckets, 0.5)
    p95 = history.percentile(buckets, 0.95)
    assert p50 is not None and 0.001 <= p50 < 0.002
    assert p95 is not None and 1.024 <= p95 < 2.048
    assert history.percentile([0] * HISTOGRAM_BUCKETS, 0.5) is None


def test_a_minute_written_again_holds_its_latest_figures(alias: str) -> None:
    key = (T0, "default", "tests.noop")
    history.write_minutes(alias, "w1", {key: figures(completed=2)})
    history.write_minutes(alias, "w1", {key: figures(completed=5, failed=1)})
    history.write_minutes(alias, "w2", {key: figures(completed=1)})
    rows = HistoryRollup.objects.using(alias).filter(span=MINUTE, start=T0)
    assert sorted(rows.values_list("worker", "completed", "failed")) == [
        ("w1", 5, 1),
        ("w2", 1, 0),
    ]


def test_one_caller_a_minute_samples_the_depth(alias: str) -> None:
    Job.objects.using(alias).create(kind="tests.noop", payload={"n": 1}, queue="mail")
    Job.objects.using(alias).create(kind="tests.noop", payload={"n": 2}, queue="mail")
    Job.objects.using(alias).create(
        kind="tests.noop", payload={"n": 3}, state="waiting", waiting_for=1
    )
    assert history.minute_chores(alias, T0 + timedelta(seconds=30))
    assert not history.minute_chores(alias, T0 + timedelta(seconds=50))  # taken already
    depth = HistoryRollup.objects.using(alias).filter(span=MINUTE, start=T0, worker="")
    assert sorted(depth.values_list("queue", "kind", "ready", "waiting", "samples")) == [
        ("", "", 0, 0, 1),
        ("default", "tests.noop", 0, 1, 0),
        ("mail", "tests.noop", 2, 0, 0),
    ]


def test_an_hour_is_derived_from_its_minutes_once_settled(alias: str) -> None:
    for minute in range(3):
        start = T0 + timedelta(minutes=minute)
        history.write_minutes(alias, "w1", {(start, "default", "k"): figures(completed=2)})
        history.write_minutes(alias, "w2", {(start, "default", "k"): figures(failed=1)})
        history.take_minute(alias, start)
    early = T0 + timedelta(hours=1, minutes=1)  # the hour has not settled yet
    assert history.hours_to_derive(alias, early) == []
    now = T0 + timedelta(hours=1, minutes=5)
    assert history.hours_to_derive(alias, now) == [T0]
    history.derive_hour(alias, T0)
    assert history.hours_to_derive(alias, now) == []
    hour = HistoryRollup.objects.using(alias).filter(span=HOUR, start=T0)
    assert sorted(hour.values_list("queue", "kind", "completed", "failed", "samples")) == [
        ("", "", 6, 3, 3),  # the marker: every queue's totals, and the samples
        ("default", "", 6, 3, 0),  # the queue's totals
        ("default", "k", 6, 3, 0),
    ]
    assert hour.get(kind="k").run_00 == 9


def test_pruning_keeps_a_day_of_minutes_and_a_month_of_hours(alias: str) -> None:
    now = T0 + timedelta(days=40)
    for span, age in [(MINUTE, timedelta(hours=26)), (MINUTE, timedelta(hours=2))]:
        HistoryRollup.objects.using(alias).create(span=span, start=now - age, kind="k")
    for span, age in [(HOUR, timedelta(days=32)), (HOUR, timedelta(days=29))]:
        HistoryRollup.objects.using(alias).create(span=span, start=now - age, kind="k")
    assert history.prune(alias, now) == 2
    kept = HistoryRollup.objects.using(alias).order_by("span", "start")
    assert [(row.span, now - row.start) for row in kept] == [
        (HOUR, timedelta(days=29)),
        (MINUTE, timedelta(hours=2)),
    ]


def test_a_worker_writes_the_figures_of_its_runs(alias: str) -> None:
    for n in range(3):
        tasks.Noop(n=n).enqueue(using=alias)
    tasks.Permanent().enqueue(using=alias)
    tasks.AlwaysFails().enqueue(using=alias)  # 3 attempts: 2 retried runs, then failed
    Worker(burst=True, database=alias, concurrency=2, poll_interval=0.05).run()
    rows = HistoryRollup.objects.using(alias).filter(span=MINUTE).exclude(worker="")
    by_kind = {
        kind: (completed, failed, retried, runs)
        for kind, completed, failed, retried, runs in rows.values_list("kind")
        .annotate(Sum("completed"), Sum("failed"), Sum("retried"), Sum(RUN_COLUMNS[0]))
        .values_list("kind", "completed__sum", "failed__sum", "retried__sum", "run_00__sum")
    }
    assert {kind: figures[:3] for kind, figures in by_kind.items()} == {
        "tests.noop": (3, 0, 0),
        "tests.permanent": (0, 1, 0),
        "tests.always_fails": (0, 1, 2),
    }
    runs = 0
    waits = 0
    for row in rows:
        runs += sum(getattr(row, column) for column in RUN_COLUMNS)
        waits += sum(getattr(row, f"wait_{index:02d}") for index in range(HISTOGRAM_BUCKETS))
    assert runs == waits == 7  # every run that started has a run time and a wait


@override_settings(VENTURI={"HISTORY_FLUSH_INTERVAL": 0.1})
def test_a_running_worker_samples_the_depth_and_writes_its_minutes(alias: str) -> None:
    held = Job.objects.using(alias).create(
        kind="tests.noop", payload={"n": 0}, state="waiting", waiting_for=1
    )
    worker = Worker(database=alias, concurrency=1, poll_interval=0.05)
    thread, box = in_thread(worker.run)
    try:
        tasks.Noop(n=1).enqueue(using=alias)
        rows = HistoryRollup.objects.using(alias).filter(span=MINUTE)
        wait_until(lambda: rows.filter(kind="tests.noop", waiting=1).exists(), message="depth")
        wait_until(lambda: rows.filter(kind="tests.noop", completed=1).exists(), message="runs")
    finally:
        worker.stop()
        result_of(thread, box, timeout=30)
    assert rows.filter(kind="tests.noop", worker=worker.name).get().completed == 1
    assert Job.objects.using(alias).get(pk=held.pk).state == "waiting"


@override_settings(VENTURI={"HISTORY": False})
def test_history_off_writes_nothing(alias: str) -> None:
    tasks.Noop(n=1).enqueue(using=alias)
    Worker(burst=True, database=alias, concurrency=1, poll_interval=0.05).run()
    assert Job.objects.using(alias).get().state == "completed"
    assert not HistoryRollup.objects.using(alias).exists()


@pytest.mark.django_db(databases=["default"])
@pytest.mark.parametrize(
    ("setting", "value", "check_id"),
    [
        ("HISTORY", "yes", "venturi.E075"),
        ("HISTORY_FLUSH_INTERVAL", timedelta(minutes=5), "venturi.E003"),
        ("HISTORY_FLUSH_INTERVAL", 0, "venturi.E003"),
    ],
)
def test_bad_history_settings_are_named(setting: str, value: object, check_id: str) -> None:
    with override_settings(VENTURI={setting: value}):
        errors = check_settings(None)
    assert [(error.id, setting in error.msg) for error in errors] == [(check_id, True)]
