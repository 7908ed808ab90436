"""Deduplication: the merge decisions, the one-ready-job-per-key index, and concurrent producers."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connections, transaction
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.states import LIVE_STATES
from django_venturi.store import key_locks, verdicts
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.completion import write_verdicts
from django_venturi.store.connections import connection_params
from django_venturi.store.scheduling import TierClock
from tests.conftest import ROOT, Workers, wait_until, worker_env
from tests.testapp import dedup_tasks
from tests.testapp.dedup_tasks import BadKey, Decides, Latest, Once, PausingRecompute, Recompute
from tests.testapp.models import Record
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

PRODUCERS = 8
ENQUEUES_EACH = 25


@pytest.fixture(autouse=True)
def _forget_merges() -> None:
    dedup_tasks.SEEN.clear()


def live(alias: str, kind: str | None = None) -> list[Job]:
    jobs = Job.objects.using(alias).filter(state__in=LIVE_STATES).order_by("id")
    return list(jobs.filter(kind=kind) if kind else jobs)


def claim_all(alias: str, kind: str) -> list[ClaimedJob]:
    request = ClaimRequest(
        worker="test", limit=100, kinds=[kind], leases=[timedelta(minutes=5)], queues=None
    )
    return claim(alias, request, TierClock((6, 3, 1)))


# ---------------------------------------------------------------- keys


@pytest.mark.parametrize(
    ("key", "error", "message"),
    [
        ("x" * 201, ValueError, r"BadKey\.dedup_key\(\) returned a dedup_key of 201 characters"),
        ("a\nb", ValueError, r"dedup_key with unprintable characters"),
        ("", ValueError, r"empty dedup_key; return None"),
        (5, TypeError, r"BadKey\.dedup_key\(\) must return a str or None, got int"),
    ],
)
def test_a_bad_key_is_refused_and_writes_nothing(
    alias: str, key: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        BadKey(key=key).enqueue(using=alias)
    with pytest.raises(error, match=message):
        venturi.enqueue_many([Noop(), BadKey(key=key)], using=alias)
    with pytest.raises(error, match=message), transaction.atomic(using=alias):
        BadKey(key=key).enqueue_on_commit(using=alias)
    assert Job.objects.using(alias).count() == 0


def test_a_key_of_200_printable_characters_is_stored(alias: str) -> None:
    key = "é" * 100 + "k:1 " * 25
    job = BadKey(key=key).enqueue(using=alias)
    assert Job.objects.using(alias).get(pk=job.pk).dedup_key == key == job.dedup_key


def test_none_means_no_dedup(alias: str) -> None:
    first, second = Once(name="").enqueue(using=alias), Once(name="").enqueue(using=alias)
    assert first.pk != second.pk and first.dedup_key is None
    assert len(live(alias)) == 2


# ---------------------------------------------------------------- decisions


def test_without_merge_the_duplicate_is_dropped_and_counted(alias: str) -> None:
    first = Once(name="a", value=1).enqueue(using=alias)
    second = Once(name="a", value=2).enqueue(using=alias)
    assert second.pk == first.pk
    assert second.payload == {"name": "a", "value": 1}
    assert second.merged_count == 1 and second.last_merged_at is not None
    stored = Job.objects.using(alias).get()
    assert (stored.merged_count, stored.last_merged_at) == (1, second.last_merged_at)
    assert stored.dedup_key == "a"


def test_keys_are_per_kind_and_distinct_keys_stay_apart(alias: str) -> None:
    Once(name="a").enqueue(using=alias)
    Once(name="b").enqueue(using=alias)
    Latest(name="a", value=1).enqueue(using=alias)
    assert sorted((job.kind, job.dedup_key) for job in live(alias)) == [
        ("tests.latest", "a"),
        ("tests.once", "a"),
        ("tests.once", "b"),
    ]


def test_a_keep_decision_leaves_the_first_payload_in_place(alias: str) -> None:
    first = Decides(name="k", value=1).enqueue(using=alias)
    job = Decides(name="k", decision="keep", value=5).enqueue(using=alias)
    assert job.pk == first.pk and job.payload["value"] == 1


def test_replace_stores_the_new_payload_and_may_move_run_at_and_priority(alias: str) -> None:
    later = timezone.now() + timedelta(hours=3)
    first = Decides(name="r", value=1).enqueue(delay=timedelta(hours=1), using=alias)
    job = Decides(name="r", decision="replace", value=7).enqueue(using=alias)
    assert job.pk == first.pk and job.payload["value"] == 7
    assert job.run_at == first.run_at and job.priority == venturi.Priority.NORMAL
    job = Decides(
        name="r", decision="replace", value=8, run_at=later, priority=int(venturi.Priority.HIGH)
    ).enqueue(using=alias)
    stored = Job.objects.using(alias).get()
    assert (stored.payload["value"], stored.run_at, stored.priority) == (
        8,
        later,
        venturi.Priority.HIGH,
    )
    assert stored.merged_count == 2 and job.run_at == later


def test_update_stores_the_merged_payload(alias: str) -> None:
    Decides(name="u", value=1).enqueue(using=alias)
    for value in (2, 3, 4):
        job = Decides(name="u", decision="update", value=value).enqueue(using=alias)
    assert job.payload["value"] == 10 and job.merged_count == 3
    assert Job.objects.using(alias).get().payload["value"] == 10


def test_enqueue_is_refused_when_the_existing_job_is_ready(alias: str) -> None:
    first = Decides(name="e", value=1).enqueue(using=alias)
    with pytest.raises(ValueError, match=rf"Merge.enqueue\(\) but job #{first.pk} is ready"):
        Decides(name="e", decision="enqueue").enqueue(using=alias)
    assert Job.objects.using(alias).get().merged_count == 0


def test_a_merge_that_returns_no_decision_or_raises_is_an_error(alias: str) -> None:
    Decides(name="b", value=1).enqueue(using=alias)
    with pytest.raises(TypeError, match=r"Decides\.merge\(\) must return a venturi\.Merge"):
        Decides(name="b", decision="bad").enqueue(using=alias)
    with pytest.raises(RuntimeError, match="on purpose"):
        Decides(name="b", decision="raise").enqueue(using=alias)
    assert Job.objects.using(alias).get().merged_count == 0


def test_an_update_that_does_not_fit_the_payload_type_is_refused(alias: str) -> None:
    Decides(name="w", value=1).enqueue(using=alias)
    with pytest.raises(venturi.PayloadError, match=r"Decides\.value: expected int, got str"):
        Decides(name="w", decision="wrong").enqueue(using=alias)
    assert Job.objects.using(alias).get().payload["value"] == 1


def test_existing_shows_the_typed_payload_carry_attempt_state_and_journal(alias: str) -> None:
    first = Decides(name="s", value=3).enqueue(using=alias)
    (claimed,) = claim_all(alias, "tests.decides")
    paused = verdicts.Verdict(
        claimed,
        venturi.JournalOutcome.PAUSED,
        venturi.State.READY,
        set_carry=True,
        carry={"page": 4},
    )
    write_verdicts(alias, "test", [paused])
    Decides(name="s", decision="keep").enqueue(using=alias)
    (existing,) = dedup_tasks.SEEN
    stored = Job.objects.using(alias).get()
    assert existing.job_id == first.pk
    assert existing.payload == Decides(name="s", value=3)
    assert (existing.carry, existing.attempt, existing.state) == (
        {"page": 4},
        1,
        venturi.State.READY,
    )
    assert existing.run_at == stored.run_at and existing.priority == venturi.Priority.NORMAL
    assert [entry.outcome for entry in existing.journal] == [venturi.JournalOutcome.PAUSED]


# ---------------------------------------------------------------- running jobs and follow-ups


def test_a_running_job_gets_one_follow_up_and_later_enqueues_merge_into_it(alias: str) -> None:
    running = Recompute(account="r").enqueue(using=alias)
    claim_all(alias, "tests.recompute")
    follow_up = Recompute(account="r", count=2).enqueue(using=alias)
    assert follow_up.pk != running.pk and follow_up.state == venturi.State.READY
    again = Recompute(account="r", count=3).enqueue(using=alias)
    assert again.pk == follow_up.pk and again.payload["count"] == 5
    assert [(job.state, job.payload["count"]) for job in live(alias)] == [
        (venturi.State.RUNNING, 1),
        (venturi.State.READY, 5),
    ]


def test_merge_sees_a_running_job_as_running(alias: str) -> None:
    first = Decides(name="m", value=1).enqueue(using=alias)
    claim_all(alias, "tests.decides")
    kept = Decides(name="m", decision="keep").enqueue(using=alias)
    assert kept.pk == first.pk and kept.state == venturi.State.RUNNING
    assert dedup_tasks.SEEN[-1].state == venturi.State.RUNNING
    assert dedup_tasks.SEEN[-1].attempt == 1
    updated = Decides(name="m", decision="update", value=4).enqueue(using=alias)
    assert updated.pk == first.pk and updated.payload["value"] == 5  # for a later run
    assert len(live(alias)) == 1


def test_once_only_drops_duplicates_of_a_running_job_too(alias: str) -> None:
    first = Once(name="o").enqueue(using=alias)
    claim_all(alias, "tests.once")
    assert Once(name="o").enqueue(using=alias).pk == first.pk
    assert len(live(alias)) == 1


def test_a_job_claimed_while_a_producer_waits_for_it_is_merged_by_the_running_rule() -> None:
    """The producer waits for the row a claim holds, then sees the job as running."""
    alias = "default"
    first = Recompute(account="c").enqueue(using=alias)
    result: list[Job] = []

    def producer() -> None:
        try:
            result.append(Recompute(account="c", count=5).enqueue(using=alias))
        finally:
            connections.close_all()

    thread = threading.Thread(target=producer)
    with transaction.atomic(using=alias):
        # A claim in flight: the row is locked and turned running, not yet committed.
        Job.objects.using(alias).select_for_update().filter(pk=first.pk).update(
            state=venturi.State.RUNNING,
            attempt=1,
            claim_token=uuid.uuid4(),
            lease_expires_at=timezone.now() + timedelta(minutes=5),
        )
        thread.start()
        wait_until(lambda: waiting_on_a_lock(alias), message="the producer to wait for the row")
    thread.join(10)
    (follow_up,) = result
    assert follow_up.pk != first.pk and follow_up.payload["count"] == 5
    assert [job.state for job in live(alias)] == [venturi.State.RUNNING, venturi.State.READY]


def waiting_on_a_lock(alias: str) -> bool:
    with connections[alias].cursor() as cursor:
        # Inside a transaction pg_stat_activity is a snapshot taken at first use.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        row = cursor.fetchone()
    return bool(row and row[0])


# ---------------------------------------------------------------- transactions and batches


def test_a_rollback_undoes_the_merge(alias: str) -> None:
    Recompute(account="t").enqueue(using=alias)
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        job = Recompute(account="t", count=5).enqueue(using=alias)
        assert job.payload["count"] == 6
        raise RuntimeError("the view failed")
    stored = Job.objects.using(alias).get()
    assert (stored.payload["count"], stored.merged_count, stored.last_merged_at) == (1, 0, None)


def test_a_rollback_undoes_a_new_keyed_job_and_frees_its_key(alias: str) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        Recompute(account="n").enqueue(using=alias)
        raise RuntimeError
    assert Job.objects.using(alias).count() == 0
    assert Recompute(account="n", count=4).enqueue(using=alias).payload["count"] == 4


def test_enqueue_on_commit_merges_at_commit(alias: str) -> None:
    Recompute(account="oc").enqueue(using=alias)
    with transaction.atomic(using=alias):
        Recompute(account="oc", count=2).enqueue_on_commit(using=alias)
        assert Job.objects.using(alias).get().payload["count"] == 1
    assert Job.objects.using(alias).get().payload["count"] == 3


def test_a_batch_merges_its_own_duplicates_in_order(alias: str) -> None:
    Latest(name="l", value=0).enqueue(using=alias)
    jobs = venturi.enqueue_many(
        [
            Recompute(account="a"),
            Noop(n=1),
            Recompute(account="b", count=10),
            Recompute(account="a", count=2),
            Latest(name="l", value=1),
            Noop(n=2),
            Recompute(account="a", count=3),
            Latest(name="l", value=2),
        ],
        using=alias,
    )
    assert [job.kind for job in jobs] == [
        "tests.recompute",
        "tests.noop",
        "tests.recompute",
        "tests.recompute",
        "tests.latest",
        "tests.noop",
        "tests.recompute",
        "tests.latest",
    ]
    assert jobs[0].pk == jobs[3].pk == jobs[6].pk and jobs[6].payload["count"] == 6
    assert jobs[4].pk == jobs[7].pk and jobs[7].payload["value"] == 2
    by_key = {(job.kind, job.dedup_key): job for job in live(alias)}
    assert len(live(alias)) == 5
    assert by_key[("tests.recompute", "account:a")].payload["count"] == 6
    assert by_key[("tests.recompute", "account:a")].merged_count == 2
    assert by_key[("tests.recompute", "account:b")].payload["count"] == 10
    assert by_key[("tests.latest", "l")].payload["value"] == 2


def test_a_plain_batch_is_still_one_insert(alias: str) -> None:
    from django.test.utils import CaptureQueriesContext

    # As many rows as stay under SQLite's 999 bound parameters per statement (Django
    # splits larger batches there); PostgreSQL's array insert has no such bound.
    columns = len([field for field in Job._meta.concrete_fields if not field.primary_key])
    with CaptureQueriesContext(connections[alias]) as queries:
        venturi.enqueue_many([Noop(n=i) for i in range(999 // columns)], using=alias)
    assert len([q for q in queries.captured_queries if "INSERT" in q["sql"].upper()]) == 1


# ---------------------------------------------------------------- finished jobs free the key


def test_the_key_is_free_again_after_the_job_finishes(alias: str, workers: object) -> None:
    first = Recompute(account="f", count=3).enqueue(using=alias)
    workers.burst(alias)  # type: ignore[attr-defined]
    assert Job.objects.using(alias).get(pk=first.pk).state == venturi.State.COMPLETED
    second = Recompute(account="f", count=4).enqueue(using=alias)
    assert second.pk != first.pk and second.payload["count"] == 4
    for state, verdict in [
        (venturi.State.FAILED, verdicts.failed),
        (venturi.State.CANCELLED, None),
    ]:
        (claimed,) = claim_all(alias, "tests.recompute")
        if verdict is None:
            Job.objects.using(alias).filter(pk=claimed.id).update(
                state=state, finished_at=timezone.now(), claim_token=None, lease_expires_at=None
            )
        else:
            write_verdicts(alias, "test", [verdict(claimed, verdicts.ErrorInfo())])
        again = Recompute(account="f", count=5).enqueue(using=alias)
        assert again.pk != claimed.id and again.state == venturi.State.READY
    assert [r.value["count"] for r in Record.objects.using(alias).all()] == [3]


# ---------------------------------------------------------------- the follow-up hazard


def follow_up_behind_a_running_job(alias: str) -> tuple[ClaimedJob, Job]:
    Recompute(account="h", count=1).enqueue(using=alias)
    (running,) = claim_all(alias, "tests.recompute")
    follow_up = Recompute(account="h", count=2).enqueue(using=alias)
    assert follow_up.pk != running.id
    return running, follow_up


def paused(job: ClaimedJob) -> verdicts.Verdict:
    return verdicts.Verdict(job, venturi.JournalOutcome.PAUSED, venturi.State.READY)


@pytest.mark.parametrize("outcome", ["paused", "retry", "released"])
def test_a_job_going_back_to_ready_absorbs_its_follow_up(alias: str, outcome: str) -> None:
    running, follow_up = follow_up_behind_a_running_job(alias)
    verdict = {
        "paused": paused(running),
        "retry": verdicts.retry(running, None, verdicts.ErrorInfo("E", "boom")),
        "released": verdicts.released(running),
    }[outcome]
    assert write_verdicts(alias, "test", [verdict]) == {running.id}
    (survivor,) = live(alias)
    assert survivor.pk == running.id and survivor.state == venturi.State.READY
    assert survivor.payload == {"account": "h", "count": 3}  # by Recompute.merge
    assert survivor.merged_count == 1 and survivor.last_merged_at is not None
    absorbed = Job.objects.using(alias).get(pk=follow_up.pk)
    assert absorbed.state == venturi.State.CANCELLED and absorbed.finished_at is not None
    assert absorbed.last_error == f"merged into job #{running.id} when it went back to ready"
    assert Recompute(account="h", count=4).enqueue(using=alias).payload["count"] == 7


def test_two_running_jobs_of_a_key_going_back_to_ready_together_fold_into_one(alias: str) -> None:
    first, follow_up = follow_up_behind_a_running_job(alias)
    # Claims never run a follow-up beside its predecessor any more (it waits), but the
    # fold must hold if two running jobs of a key exist, e.g. rows of an older release.
    assert claim_all(alias, "tests.recompute") == []
    token = uuid.uuid4()
    Job.objects.using(alias).filter(pk=follow_up.pk).update(
        state=venturi.State.RUNNING,
        attempt=1,
        claim_token=token,
        started_at=timezone.now(),
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )
    second = ClaimedJob.from_row(
        Job.objects.using(alias).get(pk=follow_up.pk),
        attempt=1,
        started_at=timezone.now(),
        claim_token=token,
        lease=timedelta(minutes=5),
    )
    third = Recompute(account="h", count=4).enqueue(using=alias)
    assert write_verdicts(alias, "test", [paused(second), paused(first)]) == {first.id, second.id}
    (survivor,) = live(alias)
    assert survivor.pk == first.id and survivor.payload["count"] == 1 + 2 + 4
    assert Job.objects.using(alias).get(pk=second.id).state == venturi.State.CANCELLED
    assert Job.objects.using(alias).get(pk=third.pk).state == venturi.State.CANCELLED
    journal = Job.objects.using(alias).get(pk=second.id).journal.get()
    assert journal.outcome == venturi.JournalOutcome.PAUSED


def absorb_a_follow_up_whose_merge_fails(alias: str, decision: str | None = None) -> None:
    """A running job pauses; its follow-up's merge() fails as `decision` makes it (by default
    it returns enqueue, impossible once both would be ready). The returning job keeps its
    payload and absorbs the follow-up."""
    Decides(name="h", value=1).enqueue(using=alias)
    (running,) = claim_all(alias, "tests.decides")
    follow_up = Decides(name="h", decision="enqueue", value=2).enqueue(using=alias)
    if decision is not None:
        Job.objects.using(alias).filter(pk=follow_up.pk).update(
            payload={**follow_up.payload, "decision": decision}
        )
    assert write_verdicts(alias, "test", [paused(running)]) == {running.id}
    (survivor,) = live(alias)
    assert survivor.pk == running.id and survivor.payload["value"] == 1
    assert Job.objects.using(alias).get(pk=follow_up.pk).state == venturi.State.CANCELLED


def test_a_merge_that_fails_while_absorbing_keeps_the_returning_payload(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_venturi"):
        absorb_a_follow_up_whose_merge_fails(alias)
    assert "without merging" in caplog.text


def test_a_merge_that_hits_a_database_error_while_absorbing_spoils_nothing(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On PostgreSQL the error used to abort the verdicts' transaction: the write failed."""
    with caplog.at_level(logging.WARNING, logger="django_venturi"):
        absorb_a_follow_up_whose_merge_fails(alias, decision=f"database:{alias}")
    assert "without merging" in caplog.text and "venturi_no_such_table" in caplog.text


def test_a_lost_lease_with_a_follow_up_is_recovered(alias: str) -> None:
    from django_venturi.store.leases import recover_expired

    running, _ = follow_up_behind_a_running_job(alias)
    Job.objects.using(alias).filter(pk=running.id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert recover_expired(alias, "rescuer") == [running.id]
    (survivor,) = live(alias)
    assert survivor.pk == running.id and survivor.payload["count"] == 3


def test_a_late_verdict_of_a_reclaimed_job_does_not_fold(alias: str) -> None:
    running, follow_up = follow_up_behind_a_running_job(alias)
    stale = dataclasses.replace(running, claim_token=uuid.UUID(int=1))
    assert write_verdicts(alias, "test", [paused(stale)]) == set()
    assert [job.pk for job in live(alias)] == [running.id, follow_up.pk]


def test_a_returning_job_asked_to_cancel_leaves_its_follow_up_ready(alias: str) -> None:
    """Issue 15: the cancelled job used to absorb its follow-up, and the follow-up was lost."""
    from django_venturi.store.leases import recover_expired

    for outcome in ["lease_expired", "paused", "retry", "released"]:
        running, follow_up = follow_up_behind_a_running_job(alias)
        assert venturi.cancel(running.id, using=alias).stopping == 1
        if outcome == "lease_expired":
            Job.objects.using(alias).filter(pk=running.id).update(
                lease_expires_at=timezone.now() - timedelta(seconds=1)
            )
            assert recover_expired(alias, "rescuer") == [running.id]
        else:
            verdict = {
                "paused": paused(running),
                "retry": verdicts.retry(running, None, verdicts.ErrorInfo("E", "boom")),
                "released": verdicts.released(running),
            }[outcome]
            assert write_verdicts(alias, "test", [verdict]) == {running.id}
        cancelled = Job.objects.using(alias).get(pk=running.id)
        assert cancelled.state == venturi.State.CANCELLED, outcome
        assert cancelled.payload == {"account": "h", "count": 1} and cancelled.merged_count == 0
        assert cancelled.journal.get().outcome == venturi.JournalOutcome.CANCELLED
        (kept,) = live(alias)
        assert kept.pk == follow_up.pk and kept.state == venturi.State.READY, outcome
        assert kept.payload == {"account": "h", "count": 2} and kept.last_error == ""
        Job.objects.using(alias).all().delete()


def test_an_enqueue_never_merges_into_a_running_job_asked_to_cancel(alias: str) -> None:
    """It would end cancelled with the new work in it: the new job queues behind it instead."""
    Decides(name="c", value=1).enqueue(using=alias)
    (running,) = claim_all(alias, "tests.decides")
    venturi.cancel(running.id, using=alias)
    new = Decides(name="c", decision="keep", value=2).enqueue(using=alias)
    assert new.pk != running.id and new.state == venturi.State.READY
    assert write_verdicts(alias, "test", [verdicts.completed(running)]) == {running.id}
    (left,) = live(alias)
    assert left.pk == new.pk and left.payload["value"] == 2
    assert Job.objects.using(alias).get(pk=running.id).merged_count == 0


def test_a_stale_runs_verdict_beside_the_live_runs_does_not_stop_the_fold(alias: str) -> None:
    """The fold looked the job's verdict up by job id: the stale one hid the live one, the
    job went back to ready beside its follow-up, and the unique index refused the write."""
    Recompute(account="s", count=1).enqueue(using=alias)
    (stale,) = claim_all(alias, "tests.recompute")
    write_verdicts(alias, "test", [verdicts.released(stale)])
    (running,) = claim_all(alias, "tests.recompute")
    follow_up = Recompute(account="s", count=2).enqueue(using=alias)
    batch = [paused(running), verdicts.released(stale)]
    assert write_verdicts(alias, "test", batch) == {running.id}
    (survivor,) = live(alias)
    assert survivor.pk == running.id and survivor.payload["count"] == 3
    assert Job.objects.using(alias).get(pk=follow_up.pk).state == venturi.State.CANCELLED
    outcomes = survivor.journal.order_by("id").values_list("outcome", flat=True)
    assert list(outcomes) == ["released", "paused", "discarded"]


# ---------------------------------------------------------------- concurrent producers


def produce(alias: str, make: object, errors: list[BaseException]) -> None:
    try:
        for i in range(ENQUEUES_EACH):
            make(i).enqueue(using=alias)  # type: ignore[operator]
    except BaseException as error:
        errors.append(error)
    finally:
        connections.close_all()


def run_threads(alias: str, make: object) -> None:
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=produce, args=(alias, make, errors)) for _ in range(PRODUCERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors


def test_concurrent_threads_sum_into_one_job(alias: str) -> None:
    run_threads(alias, lambda i: Recompute(account="hot"))
    (job,) = live(alias)
    assert job.payload["count"] == PRODUCERS * ENQUEUES_EACH
    assert job.merged_count == PRODUCERS * ENQUEUES_EACH - 1


@pytest.mark.parametrize("task", ["keep", "replace", "update", "enqueue"])
def test_concurrent_threads_for_each_decision(task: str) -> None:
    alias = "default"
    total = PRODUCERS * ENQUEUES_EACH
    if task == "enqueue":
        Recompute(account="d").enqueue(using=alias)
        claim_all(alias, "tests.recompute")
        run_threads(alias, lambda i: Recompute(account="d"))
        running, follow_up = live(alias)
        assert running.state == venturi.State.RUNNING and running.payload["count"] == 1
        assert follow_up.payload["count"] == total and follow_up.merged_count == total - 1
        return
    make = {
        "keep": lambda i: Once(name="d", value=i),
        "replace": lambda i: Latest(name="d", value=i),
        "update": lambda i: Decides(name="d", decision="update", value=1),
    }[task]
    run_threads(alias, make)
    (job,) = live(alias)
    assert job.merged_count == total - 1
    if task == "update":
        assert job.payload["value"] == total
    if task == "replace":
        assert job.payload["value"] == ENQUEUES_EACH - 1  # some producer's last enqueue


SCRIPT = """
from tests.testapp.dedup_tasks import Recompute
for _ in range({count}):
    Recompute(account={account!r}).enqueue(using={alias!r})
"""


def test_concurrent_processes_sum_into_one_job_per_key() -> None:
    alias = "default"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "django",
                "shell",
                "-c",
                SCRIPT.format(count=ENQUEUES_EACH, account=f"p{n % 2}", alias=alias),
            ],
            env=worker_env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(PRODUCERS)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr.decode()
    jobs = live(alias)
    assert sorted((job.dedup_key, job.payload["count"]) for job in jobs) == [
        ("account:p0", PRODUCERS * ENQUEUES_EACH // 2),
        ("account:p1", PRODUCERS * ENQUEUES_EACH // 2),
    ]


def test_concurrent_producers_and_a_worker_lose_no_enqueue(workers: object) -> None:
    """While a worker claims and completes, every enqueue is run or merged into a run."""
    alias = "default"
    workers.start(alias, "--concurrency", "4")  # type: ignore[attr-defined]
    run_threads(alias, lambda i: Recompute(account=f"w{i % 3}"))
    wait_until(lambda: not live(alias), timeout=60, message="the worker to drain")
    counts = [record.value["count"] for record in Record.objects.using(alias).all()]
    assert sum(counts) == PRODUCERS * ENQUEUES_EACH


def test_pausing_jobs_with_follow_ups_under_producers_lose_nothing(
    alias: str, workers: object
) -> None:
    """Real workers pause keyed jobs while producers queue follow-ups: no verdict fails."""
    PausingRecompute(account="p0").enqueue(using=alias)
    workers.start(alias, "--concurrency", "4")  # type: ignore[attr-defined]
    wait_until(
        lambda: Job.objects.using(alias).filter(attempt__gt=0).exists(),
        message="the worker to start",
    )

    def slowly(i: int) -> PausingRecompute:
        time.sleep(0.005)  # spread the enqueues over the runs and pauses
        return PausingRecompute(account=f"p{i % 2}")

    run_threads(alias, slowly)
    wait_until(lambda: not live(alias), timeout=90, message="the worker to drain")
    counts = [record.value["count"] for record in Record.objects.using(alias).all()]
    assert sum(counts) == 1 + PRODUCERS * ENQUEUES_EACH
    log = workers.log()  # type: ignore[attr-defined]
    assert "IntegrityError" not in log and "Traceback" not in log, log


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_follow_up_waits_until_the_running_job_of_its_key_is_done(alias: str) -> None:
    from tests.testapp.dedup_tasks import Recompute

    Recompute(account="a").enqueue(using=alias)
    (first,) = claim_all(alias, "tests.recompute")
    follow_up = Recompute(account="a").enqueue(using=alias)  # merge() says enqueue: it is running
    other_key = Recompute(account="b").enqueue(using=alias)
    assert follow_up.pk != first.id
    # The follow-up is ready and due, but not claimed while the first run goes on;
    # other keys of the kind are not held back.
    assert [job.id for job in claim_all(alias, "tests.recompute")] == [other_key.pk]
    assert write_verdicts(alias, "w", [verdicts.completed(first)]) == {first.id}
    assert [job.id for job in claim_all(alias, "tests.recompute")] == [follow_up.pk]


def test_a_producer_holding_a_key_holds_back_only_that_keys_verdict(
    workers: Workers,
) -> None:
    """A producer whose transaction enqueued a key and has not ended holds the key's lock.
    A running job of that key going back to `ready` must fold under that lock, so its
    verdict waits: the worker holds it back and writes every other verdict meanwhile,
    instead of stalling its whole results writer behind someone else's transaction."""
    keyed = PausingRecompute(account="held", steps=1).enqueue()
    with psycopg.connect(**connection_params("default"), autocommit=True) as producer:
        # What a producer's open transaction holds after a keyed enqueue: the key's lock.
        name = key_locks.lock_name(keyed.kind, "held")
        producer.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [name])
        workers.start("default")
        wait_until(
            lambda: (
                Record.objects.filter(job_id=keyed.pk).exists()
                or Job.objects.filter(pk=keyed.pk, state=venturi.State.RUNNING).exists()
            ),
            timeout=30,
            message="the keyed job claimed",
        )
        others = venturi.enqueue_many([Noop(n=n) for n in range(50)])
        wait_until(
            lambda: (
                Job.objects.filter(
                    pk__in=[job.pk for job in others], state=venturi.State.COMPLETED
                ).count()
                == len(others)
            ),
            timeout=30,
            message="the other jobs completed while the key was held",
        )
        # The scenario: its pause verdict is still held back (it would go back to ready).
        keyed.refresh_from_db()
        assert keyed.state == venturi.State.RUNNING, keyed.state
        assert keyed.attempt == 1, keyed.attempt
    # The producer's session ended: the key is free, the verdict is written, the job
    # runs its last step and completes.
    wait_until(
        lambda: Job.objects.filter(pk=keyed.pk, state=venturi.State.COMPLETED).exists(),
        timeout=30,
        message="the keyed job completed once its key was free",
    )
    outcomes = list(keyed.journal.order_by("id").values_list("outcome", flat=True))
    assert outcomes == ["paused", "completed"], outcomes
