"""Operations API: history(), stats(), cleanup() and their commands."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import DatabaseError, connection, connections
from django.test import Client
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry, RunTally
from django_venturi.observe.snapshot import stats
from django_venturi.registry import registry
from django_venturi.states import JournalOutcome
from django_venturi.store import verdicts
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.completion import write_verdicts
from django_venturi.store.journal import history
from django_venturi.store.retention import CleanupResult, cleanup
from django_venturi.store.scheduling import TierClock
from django_venturi.worker.process import Worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def run_burst(alias: str) -> None:
    Worker(burst=True, database=alias, concurrency=4, poll_interval=0.05).run()


def test_history_filters_by_kind_state_outcome_and_time(alias: str) -> None:
    flaky = tasks.Flaky(failures=1).enqueue(using=alias)
    tasks.Permanent().enqueue(using=alias)
    tasks.Noop(n=1).enqueue(using=alias)
    begun = timezone.now() - timedelta(seconds=1)
    run_burst(alias)
    everything = history(using=alias)
    assert everything.count() == 4
    assert [e.outcome for e in history(kind="tests.flaky", using=alias).reverse()] == [
        "retry",
        "completed",
    ]
    assert {e.job.kind for e in history(state=venturi.State.FAILED, using=alias)} == {
        "tests.permanent"
    }
    assert history(outcome="retry", using=alias).get().job_id == flaky.pk
    assert history(since=begun, using=alias).count() == 4
    assert history(until=begun, using=alias).count() == 0
    assert venturi.history(kind="tests.noop", using=alias).count() == 1  # the public name


def test_stats_counts_live_jobs_latency_and_the_last_hour(alias: str) -> None:
    tasks.Noop(n=1).enqueue(using=alias)
    tasks.Permanent().enqueue(using=alias)
    run_burst(alias)
    venturi.enqueue_many([tasks.Noop(n=i) for i in range(3)], queue="mail", using=alias)
    tasks.Noop(n=9).enqueue(delay=timedelta(hours=1), using=alias)
    snapshot = stats(using=alias)
    assert snapshot.ready == 4 and snapshot.running == 0
    assert snapshot.live == {
        ("ready", "tests.noop", "mail"): 3,
        ("ready", "tests.noop", "default"): 1,
    }
    assert snapshot.due == {"mail": 3}  # the delayed one is not due
    assert timedelta(0) <= snapshot.oldest_due_age["mail"] < timedelta(seconds=30)
    assert (snapshot.completed_last_hour, snapshot.failed_last_hour) == (1, 1)
    assert snapshot.failure_rate == 0.5
    assert len(snapshot.minutes) == 60
    assert venturi.stats(using=alias).ready == 4
    data = snapshot.as_dict()
    assert json.loads(json.dumps(data))["ready"] == 4


def test_venturi_stats_prints_the_counts_as_text_and_as_json(alias: str) -> None:
    tasks.Noop(n=1).enqueue(using=alias)
    out = io.StringIO()
    call_command("venturi_stats", "--database", alias, stdout=out)
    assert "1 ready, 0 waiting, 0 running" in out.getvalue()
    out = io.StringIO()
    call_command("venturi_stats", "--json", "--database", alias, stdout=out)
    assert json.loads(out.getvalue())["ready"] == 1


def test_cleanup_deletes_old_finished_jobs_only(alias: str) -> None:
    tasks.Noop(n=1).enqueue(using=alias)
    tasks.Permanent().enqueue(using=alias)
    run_burst(alias)
    live = tasks.Noop(n=2).enqueue(using=alias)
    assert cleanup(older_than=timedelta(hours=1), using=alias).jobs == 0  # not old enough
    Job.objects.using(alias).exclude(pk=live.pk).update(
        finished_at=timezone.now() - timedelta(days=2)
    )
    dry = venturi.cleanup(older_than=timedelta(days=1), dry_run=True, using=alias)
    assert (dry.jobs, dry.journal_entries) == (2, 2)
    only_failed = cleanup(older_than=timedelta(days=1), states=["failed"], using=alias)
    assert (only_failed.jobs, only_failed.journal_entries) == (1, 1)
    rest = cleanup(older_than=timedelta(days=1), batch_size=1, using=alias)
    assert (rest.jobs, rest.batches) == (1, 1)
    assert list(Job.objects.using(alias).values_list("pk", flat=True)) == [live.pk]
    with pytest.raises(ValueError, match="finished jobs only"):
        cleanup(older_than=timedelta(0), states=["ready"], using=alias)


def test_venturi_cleanup_reports_a_dry_run_then_deletes_the_old_jobs(alias: str) -> None:
    tasks.Noop(n=1).enqueue(using=alias)
    run_burst(alias)
    Job.objects.using(alias).update(finished_at=timezone.now() - timedelta(days=8))
    out = io.StringIO()
    call_command(
        "venturi_cleanup", "--older-than", "7d", "--dry-run", "--database", alias, stdout=out
    )
    assert "would delete 1 job and 1 journal entry" in out.getvalue()
    out = io.StringIO()
    call_command("venturi_cleanup", "--older-than", "7d", "--database", alias, stdout=out)
    assert "deleted 1 job and 1 journal entry in 1 batch" in out.getvalue()
    assert not Job.objects.using(alias).exists()


@pytest.mark.django_db(transaction=True)
def test_cleanup_of_50000_rows_keeps_each_batch_short() -> None:
    table = connection.ops.quote_name(Job._meta.db_table)
    journal = connection.ops.quote_name(JournalEntry._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {table} (kind, queue, priority, state, payload, attempt, failures,
                    run_at, enqueued_at, finished_at, claimed_by, last_error)
                SELECT 'tests.noop', 'default', 1, 'completed', '{{"n": 0}}', 1, 0,
                       now() - interval '9 days', now() - interval '9 days',
                       now() - interval '8 days', '', ''
                FROM generate_series(1, 50000)"""
        )
        cursor.execute(
            f"""INSERT INTO {journal} (job_id, attempt, worker, started_at, finished_at, outcome,
                    error_type, error_message, traceback)
                SELECT id, 1, 'w', finished_at, finished_at, 'completed', '', '', ''
                FROM {table}"""
        )
    reports = [CleanupResult(0, 0, 0)]
    result = cleanup(older_than=timedelta(days=7), batch_size=2000, progress=reports.append)
    assert (result.jobs, result.journal_entries, result.batches) == (50000, 50000, 25)
    # Short by size, whatever the machine's speed: each batch (its own transaction)
    # deletes 2,000 jobs and their journal entries, never the whole 50,000 at once.
    steps = [
        (later.jobs - earlier.jobs, later.journal_entries - earlier.journal_entries)
        for earlier, later in itertools.pairwise(reports)
    ]
    assert steps == [(2000, 2000)] * 25
    assert not Job.objects.exists()


def test_cancel_finishes_ready_jobs_and_asks_running_ones_to_stop(alias: str) -> None:
    ready, running, done = venturi.enqueue_many([tasks.Noop(n=i) for i in range(3)], using=alias)
    Job.objects.using(alias).filter(pk=running.pk).update(
        state=venturi.State.RUNNING,
        attempt=1,
        claim_token=uuid.uuid4(),
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )
    Job.objects.using(alias).filter(pk=done.pk).update(
        state=venturi.State.COMPLETED, finished_at=timezone.now()
    )
    result = venturi.cancel([ready, running.pk, done], using=alias)
    assert result == venturi.CancelResult(cancelled=1, stopping=1, already_finished=1)
    rows = {job.pk: job for job in Job.objects.using(alias).all()}
    assert rows[ready.pk].state == venturi.State.CANCELLED
    assert rows[ready.pk].finished_at is not None
    assert rows[running.pk].state == venturi.State.RUNNING
    assert rows[running.pk].cancel_requested_at is not None
    assert rows[done.pk].state == venturi.State.COMPLETED
    # Asked already: still stopping, and the first request's time stays.
    asked_at = rows[running.pk].cancel_requested_at
    assert venturi.cancel(running.pk, using=alias) == venturi.CancelResult(0, 1)
    assert Job.objects.using(alias).get(pk=running.pk).cancel_requested_at == asked_at


@pytest.mark.django_db(transaction=False, databases=["default"])
def test_stats_inside_a_long_transaction_counts_what_it_wrote() -> None:
    """The snapshot's clock is the statement's, not the transaction's start.

    Journal rows take `Now()`, which is the statement's time on PostgreSQL; a
    snapshot dated at the transaction's start would place them in its future
    (and out of the last hour once the minute turns, as a CI run once saw).
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")  # the (test) transaction has begun
    time.sleep(0.05)
    job = Job.objects.create(
        kind="tests.noop",
        payload={"n": 1},
        state="completed",
        attempt=1,
        finished_at=timezone.now(),
    )
    entry = JournalEntry.objects.create(
        job=job, attempt=1, outcome="completed", started_at=timezone.now()
    )
    entry.refresh_from_db()
    snapshot = stats()
    assert snapshot.taken_at >= entry.finished_at
    assert snapshot.completed_last_hour == 1


# ------------------------------------------------------------ jobs apart from runs, after cleanup


def claim_one(alias: str, kind: str) -> ClaimedJob:
    request = ClaimRequest(
        worker="test", limit=1, kinds=[kind], leases=[timedelta(minutes=5)], queues=None
    )
    (job,) = claim(alias, request, TierClock((6, 3, 1)))
    return job


def time_out_until_it_gives_up(alias: str) -> Job:
    """tests.always_fails (max_attempts=3): a timeout, a lost lease, then a timeout that
    gives up; both outcomes keep their names when they give up."""
    job = tasks.AlwaysFails().enqueue(using=alias)
    spec = registry.get("tests.always_fails")
    runs = [
        lambda claimed: verdicts.timed_out(claimed, spec, timedelta(seconds=1), ""),
        lambda claimed: verdicts.retry(
            claimed,
            spec,
            verdicts.ErrorInfo.from_reason("the lease expired"),
            outcome=JournalOutcome.LEASE_EXPIRED,
        ),
        lambda claimed: verdicts.timed_out(claimed, spec, timedelta(seconds=1), ""),
    ]
    for verdict_of in runs:
        write_verdicts(alias, "test", [verdict_of(claim_one(alias, "tests.always_fails"))])
    job.refresh_from_db(using=alias)
    assert job.state == venturi.State.FAILED
    assert list(job.journal.order_by("id").values_list("outcome", flat=True)) == [
        "timeout",
        "lease_expired",
        "timeout",
    ]
    return job


def mixed_workload(alias: str) -> None:
    """2 completed jobs, 2 failed jobs, 4 retried runs and 1 other run."""
    tasks.Flaky(failures=2).enqueue(using=alias)  # retry, retry, completed
    tasks.Permanent().enqueue(using=alias)  # failed
    tasks.Pausing(steps=2).enqueue(using=alias)  # paused, completed
    run_burst(alias)
    time_out_until_it_gives_up(alias)  # timeout, lease_expired, timeout (gave up)


def figures(alias: str) -> tuple[tuple[int, int, int, int], dict[str, tuple[int, ...]]]:
    """The last hour's four totals and the minutes that had runs."""
    snapshot = stats(using=alias)
    totals = (
        snapshot.completed_last_hour,
        snapshot.failed_last_hour,
        snapshot.retried_last_hour,
        snapshot.other_last_hour,
    )
    busy = {
        minute.start.isoformat(): (minute.completed, minute.failed, minute.retried, minute.other)
        for minute in snapshot.minutes
        if minute.completed or minute.failed or minute.retried or minute.other
    }
    return totals, busy


def test_stats_count_jobs_apart_from_runs(alias: str) -> None:
    mixed_workload(alias)
    snapshot = stats(using=alias)
    assert figures(alias)[0] == (2, 2, 4, 1)
    assert snapshot.failure_rate == 0.5  # failed jobs / (completed + failed jobs)
    data = snapshot.as_dict()
    assert (data["failed_last_hour"], data["retried_last_hour"], data["other_last_hour"]) == (
        2,
        4,
        1,
    )
    assert sum(minute["retried"] for minute in data["minutes"]) == 4


def test_every_give_up_reason_starts_as_the_stats_expect() -> None:
    """The stats tell a timeout or lost lease that gave up by `verdicts.GAVE_UP`."""
    job = ClaimedJob(
        id=1,
        kind="tests.always_fails",
        queue="default",
        priority=1,
        payload={},
        carry=None,
        attempt=3,
        failures=2,
        enqueued_at=timezone.now() - timedelta(days=1),
        started_at=timezone.now(),
        claim_token=uuid.uuid4(),
        lease=timedelta(minutes=5),
    )
    spec = registry.get("tests.always_fails")
    assert verdicts.gives_up(job, spec, 3).startswith(verdicts.GAVE_UP)
    late = dataclasses.replace(spec, max_attempts=None, give_up_after=timedelta(hours=1))
    assert verdicts.gives_up(job, late, 3).startswith(verdicts.GAVE_UP)


def test_figures_are_the_same_after_a_cleanup(alias: str) -> None:
    mixed_workload(alias)
    before = figures(alias)
    result = cleanup(older_than=timedelta(0), using=alias)
    assert result.jobs == 4 and not JournalEntry.objects.using(alias).exists()
    assert RunTally.objects.using(alias).exists()
    assert figures(alias) == before
    cleanup(older_than=timedelta(0), using=alias)  # nothing left to fold: nothing doubles
    assert figures(alias) == before
    # New runs add to what the tallies hold.
    tasks.Noop(n=1).enqueue(using=alias)
    run_burst(alias)
    (completed, *rest), _ = figures(alias)
    assert (completed, *rest) == (before[0][0] + 1, *before[0][1:])


def test_cleanup_prunes_tallies_older_than_the_window(alias: str) -> None:
    now = timezone.now().replace(second=0, microsecond=0)
    RunTally.objects.using(alias).bulk_create(
        [
            RunTally(minute=now - timedelta(hours=2), completed_jobs=5),
            RunTally(minute=now - timedelta(minutes=30), completed_jobs=3),
        ]
    )
    assert stats(using=alias).completed_last_hour == 3
    cleanup(older_than=timedelta(days=1), using=alias)
    assert list(RunTally.objects.using(alias).values_list("completed_jobs", flat=True)) == [3]
    assert stats(using=alias).completed_last_hour == 3


@pytest.fixture
def refusing_job_deletes(alias: str) -> Iterator[None]:
    """A trigger that makes the database refuse to delete a job (a failing delete)."""
    table = connections[alias].ops.quote_name(Job._meta.db_table)
    if connections[alias].vendor == "postgresql":
        create = [
            "CREATE FUNCTION venturi_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'deletes refused'; END $$",
            f"CREATE TRIGGER venturi_test_refuse BEFORE DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION venturi_test_refuse()",
        ]
        drop = [
            f"DROP TRIGGER venturi_test_refuse ON {table}",
            "DROP FUNCTION venturi_test_refuse()",
        ]
    else:
        create = [
            f"CREATE TRIGGER venturi_test_refuse BEFORE DELETE ON {table} "
            "BEGIN SELECT RAISE(ABORT, 'deletes refused'); END"
        ]
        drop = ["DROP TRIGGER venturi_test_refuse"]
    with connections[alias].cursor() as cursor:
        for statement in create:
            cursor.execute(statement)
    yield
    with connections[alias].cursor() as cursor:
        for statement in drop:
            cursor.execute(statement)


def test_a_failed_delete_leaves_no_tally(alias: str, refusing_job_deletes: None) -> None:
    mixed_workload(alias)
    before = figures(alias)
    with pytest.raises(DatabaseError, match="deletes refused"):
        cleanup(older_than=timedelta(0), using=alias)
    assert not RunTally.objects.using(alias).exists()
    assert Job.objects.using(alias).count() == 4
    assert figures(alias) == before


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_deleting_jobs_in_the_admin_keeps_the_figures() -> None:
    mixed_workload("default")
    before = figures("default")
    User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    client.login(username="admin", password="pw")
    first, *others = Job.objects.order_by("id").values_list("id", flat=True)
    page = client.post(f"/admin/django_venturi/job/{first}/delete/", {"post": "yes"})
    assert page.status_code == 302
    page = client.post(
        "/admin/django_venturi/job/",
        {"action": "delete_selected", "_selected_action": others, "post": "yes"},
    )
    assert page.status_code == 302
    assert not Job.objects.exists() and not JournalEntry.objects.exists()
    assert figures("default") == before
    page = client.get("/admin/django_venturi/job/stats/").content.decode()
    assert "2 completed, 2 failed jobs (failure rate 50.0%); 4 retried runs, 1 other run." in page
    out = io.StringIO()
    call_command("venturi_stats", stdout=out)
    assert "last hour 2 completed, 2 failed jobs (50.0% failed), 4 retried runs, 1 other run" in (
        out.getvalue()
    )
