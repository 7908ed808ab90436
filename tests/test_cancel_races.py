"""`venturi.cancel()` against verdicts and lease recovery in real concurrent sessions.

A cancel takes one locking read of its jobs in any state, in id order, and
decides by what it read; a verdict or a recovery that comes after it waits for
it and sees the cancel. Each test here holds one session at a chosen point (a
transaction left open) and lets another run into it, waiting on observable
state (`pg_stat_activity`), never on a sleep. The stress tests at the end fire
cancels at jobs that real `venturi_worker` processes keep moving between
`running` and `ready` (checkpoints, retries, lease recovery).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.store import verdicts
from django_venturi.store.claim import ClaimedJob
from django_venturi.store.completion import write_verdicts
from django_venturi.store.leases import recover_expired
from tests.conftest import Workers, vanished_run, wait_until
from tests.test_races import Session, claim_one, done_or_waiting, waits_on_a_lock
from tests.testapp.control_tasks import Cancellable, Checkpoints, KeepsFailing
from tests.testapp.tasks import Noop

ALIAS = "default"


def journal(job_id: int, alias: str = ALIAS) -> list[str]:
    entries = JournalEntry.objects.using(alias).filter(job_id=job_id).order_by("id")
    return list(entries.values_list("outcome", flat=True))


def state(job_id: int, alias: str = ALIAS) -> str:
    return str(Job.objects.using(alias).values_list("state", flat=True).get(pk=job_id))


class HeldRow:
    """A producer enqueueing a job after `job`, its transaction left open: it holds
    `job`'s row locked (`enqueue(after=...)` locks the jobs it waits for) until `release`."""

    def __init__(self, job: Job) -> None:
        self.locked = threading.Event()
        self.go_on = threading.Event()
        self.session = Session(lambda: self._enqueue_and_hold(job))
        self.session.start()
        assert self.locked.wait(30), "the producer never locked the row"

    def _enqueue_and_hold(self, job: Job) -> Job:
        with transaction.atomic(using=ALIAS):
            waiting = Noop(n=99).enqueue(after=[job], using=ALIAS)
            self.locked.set()
            assert self.go_on.wait(60), "the test never released the row"
        return waiting

    def release(self) -> Job:
        self.go_on.set()
        waiting: Job = self.session.finish()
        return waiting


def cancel_in_a_session(ids: list[int]) -> Session:
    """`venturi.cancel(ids)` in its own session; returns once it waits on a row lock."""
    cancelling = Session(lambda: venturi.cancel(ids, using=ALIAS))
    cancelling.start()
    cancelling.started_work.wait(10)
    wait_until(lambda: done_or_waiting(cancelling), message="the cancel to wait on the row")
    assert cancelling.is_alive(), "the cancel did not wait for the row another session holds"
    return cancelling


def running_job(*, expired: bool = False) -> ClaimedJob:
    """A `tests.noop` job claimed by worker `w` (which has no registry row: it is gone)."""
    Noop().enqueue(using=ALIAS)
    run = claim_one("tests.noop")
    if expired:
        Job.objects.using(ALIAS).filter(pk=run.id).update(
            lease_expires_at=run.started_at - timedelta(seconds=1)
        )
    return run


# ---------------------------------------------------------------- between the reads


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_paused_verdict_while_the_cancel_waits_on_another_row_does_not_hide_the_job() -> None:
    """The lost cancel of the issue: the cancel had read the first job and not yet the
    second when the second's paused verdict took it from `running` to `ready`."""
    first = Cancellable().enqueue(using=ALIAS)  # a lower id: the cancel locks it first
    run = running_job()
    held = HeldRow(first)
    cancelling = cancel_in_a_session([first.pk, run.id])
    paused = verdicts.Verdict(run, venturi.JournalOutcome.PAUSED, venturi.State.READY)
    assert write_verdicts(ALIAS, "w", [paused]) == {run.id}  # not held up by the cancel
    assert state(run.id) == venturi.State.READY
    waiting = held.release()

    assert cancelling.finish() == venturi.CancelResult(cancelled=2, stopping=0)
    assert state(first.pk) == state(run.id) == venturi.State.CANCELLED
    assert state(waiting.pk) == venturi.State.CANCELLED  # the dependent of the first
    assert journal(run.id) == ["paused"]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_lease_recovery_while_the_cancel_waits_on_another_row_does_not_hide_the_job() -> None:
    first = Cancellable().enqueue(using=ALIAS)
    run = running_job(expired=True)
    held = HeldRow(first)
    cancelling = cancel_in_a_session([first.pk, run.id])
    assert recover_expired(ALIAS, "rescuer") == [run.id]  # not held up by the cancel
    assert state(run.id) == venturi.State.READY
    held.release()

    assert cancelling.finish() == venturi.CancelResult(cancelled=2, stopping=0)
    assert state(run.id) == venturi.State.CANCELLED
    assert journal(run.id) == ["lease_expired"]


# ---------------------------------------------------------------- after the read


def requeue(run: ClaimedJob, outcome: str) -> verdicts.Verdict:
    """A verdict that would take the running job back to `ready`."""
    error = verdicts.ErrorInfo("RuntimeError", "again")
    return {
        "paused": verdicts.Verdict(run, venturi.JournalOutcome.PAUSED, venturi.State.READY),
        "retry": verdicts.retry(run, None, error),
        "released": verdicts.released(run),
        "timeout": verdicts.retry(run, None, error, outcome=venturi.JournalOutcome.TIMEOUT),
    }[outcome]


@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize("outcome", ["paused", "retry", "released", "timeout"])
def test_a_requeue_that_waits_for_a_cancel_ends_the_job_cancelled(outcome: str) -> None:
    """The verdict's write waits for the cancel's transaction, then sees the request."""
    run = running_job()
    asked, commit = threading.Event(), threading.Event()

    def cancel_and_hold() -> Any:
        with transaction.atomic(using=ALIAS):
            result = venturi.cancel(run.id, using=ALIAS)
            asked.set()
            assert commit.wait(60), "the test never let the cancel commit"
        return result

    cancelling = Session(cancel_and_hold)
    cancelling.start()
    assert asked.wait(30), "the cancel did not return"
    writing = Session(lambda: write_verdicts(ALIAS, "w", [requeue(run, outcome)]))
    writing.start()
    writing.started_work.wait(10)
    wait_until(lambda: waits_on_a_lock(writing), message="the verdict to wait for the cancel")
    commit.set()

    assert cancelling.finish() == venturi.CancelResult(cancelled=0, stopping=1)
    assert writing.finish() == {run.id}
    assert state(run.id) == venturi.State.CANCELLED
    assert journal(run.id) == ["cancelled"]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_recovery_that_meets_an_uncommitted_cancel_ends_the_job_cancelled() -> None:
    """Recovery skips the row the cancel holds, and on its next round sees the request."""
    run = running_job(expired=True)
    with transaction.atomic(using=ALIAS):
        assert venturi.cancel(run.id, using=ALIAS).stopping == 1
        rescuing = Session(lambda: recover_expired(ALIAS, "rescuer"))
        rescuing.start()
        assert rescuing.finish() == []  # the row was locked: left for the next round
    assert recover_expired(ALIAS, "rescuer") == [run.id]
    assert state(run.id) == venturi.State.CANCELLED
    assert journal(run.id) == ["cancelled"]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_cancel_picked_as_a_deadlock_victim_tries_again() -> None:
    """A session that locks two running jobs in the other order (as a verdict batch may)
    and the cancel's id order make a cycle; PostgreSQL aborts the cancel, which retries."""
    low, high = running_job(), running_job()
    took_high, take_low = threading.Event(), threading.Event()

    def lock_high_then_low() -> None:
        with transaction.atomic(using=ALIAS):
            jobs = Job.objects.using(ALIAS).select_for_update()
            list(jobs.filter(pk=high.id).values_list("id"))
            took_high.set()
            assert take_low.wait(60), "the test never let the session go on"
            list(jobs.filter(pk=low.id).values_list("id"))

    other = Session(lock_high_then_low)
    other.start()
    assert took_high.wait(30), "the other session never locked the second job"
    cancelling = cancel_in_a_session([low.id, high.id])  # holds `low`, waits on `high`
    take_low.set()

    other.finish()  # not the victim: the cancel, which waited first, was
    assert cancelling.finish() == venturi.CancelResult(cancelled=0, stopping=2)
    requested = Job.objects.using(ALIAS).filter(cancel_requested_at__isnull=False)
    assert sorted(requested.values_list("id", flat=True)) == [low.id, high.id]


# ---------------------------------------------------------------- stress


POOL = 40
"""Live jobs the cancels pick from; 2 workers x 8 slots keep a good share of them running."""
VANISHED = "vanished-worker"
"""The claimant of the jobs made to look claimed by a worker that is gone."""


def _new_job(alias: str, rng: random.Random) -> int:
    """A job that never finishes on its own: one that checkpoints, one that keeps failing,
    or one that checkpoints but is running now under a worker that vanished (its lease
    runs out within a second and a live worker's rescuer recovers it)."""
    roll = rng.random()
    if roll < 0.45:
        return int(Checkpoints().enqueue(using=alias).pk)
    if roll < 0.8:
        return int(KeepsFailing().enqueue(using=alias).pk)
    with transaction.atomic(using=alias):  # never seen ready by a worker
        job = Checkpoints().enqueue(using=alias)
        now = timezone.now()
        lease_end = now + timedelta(seconds=rng.uniform(0, 1))
        Job.objects.using(alias).filter(pk=job.pk).update(
            **vanished_run(lease_expires_at=lease_end, started_at=now, worker=VANISHED)
        )
    return int(job.pk)


RACED_PATHS = ("paused", "retry", "lease_expired")
"""The runs the cancels must race with: a checkpoint, a retry, a recovery."""


def _one_that_took(alias: str, pool: list[int], outcome: str) -> int | None:
    """A job of `pool` with a run journalled `outcome`, if one has."""
    return (
        JournalEntry.objects.using(alias)
        .filter(job_id__in=pool, outcome=outcome)
        .values_list("job_id", flat=True)
        .first()
    )


def stress_cancels(alias: str, workers: Workers, tries: int, seed: int) -> Counter[str]:
    """Fire `tries` cancels, one per job, at jobs workers keep moving between `running` and
    `ready`; check none is lost; return what the cancels and the runs did."""
    rng = random.Random(seed)
    for _ in range(2):
        workers.start(alias, "--concurrency", "8")
    pool = [_new_job(alias, rng) for _ in range(POOL)]
    running = Job.objects.using(alias).filter(state=venturi.State.RUNNING)
    wait_until(lambda: running.exclude(claimed_by=VANISHED).count() >= 8, timeout=60)
    # Each path is raced for certain, not by chance (a loaded machine's workers may not
    # have checkpointed, retried or recovered a job the random picks hit): the first
    # cancels go to live jobs that have already taken one, and keep taking it.
    wait_until(
        lambda: all(_one_that_took(alias, pool, path) for path in RACED_PATHS),
        timeout=60,
        message=f"live jobs that took each of {RACED_PATHS}",
    )
    first = list(dict.fromkeys(_one_that_took(alias, pool, path) for path in RACED_PATHS))
    results: dict[int, venturi.CancelResult] = {}
    for n in range(tries):
        job_id = pool.pop(pool.index(first[n]) if n < len(first) else rng.randrange(len(pool)))
        results[job_id] = venturi.cancel(job_id, using=alias)
        pool.append(_new_job(alias, rng))

    said = Counter(
        "cancelled"
        if r == venturi.CancelResult(1, 0)
        else "stopping"
        if r == venturi.CancelResult(0, 1)
        else f"lost: {r}"
        for r in results.values()
    )
    assert set(said) <= {"cancelled", "stopping"}, f"cancels that found no live job: {said}"
    cancelled = Job.objects.using(alias).filter(pk__in=list(results))

    def all_cancelled() -> bool:
        return not cancelled.exclude(state=venturi.State.CANCELLED).exists()

    wait_until(all_cancelled, timeout=120, message="every cancelled job to end cancelled")
    stopping = [job_id for job_id, r in results.items() if r.stopping]
    last_entries = (
        JournalEntry.objects.using(alias)
        .filter(job_id__in=stopping)
        .values("job_id")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    last_outcomes = Counter(
        JournalEntry.objects.using(alias)
        .filter(id__in=list(last_entries))
        .values_list("outcome", flat=True)
    )
    assert last_outcomes == {"cancelled": len(stopping)}, last_outcomes
    venturi.cancel(pool, using=alias)
    runs = Counter(
        JournalEntry.objects.using(alias)
        .filter(job_id__in=list(results))
        .values_list("outcome", flat=True)
    )
    recovered_cancelled = JournalEntry.objects.using(alias).filter(
        job_id__in=list(results), worker=VANISHED, outcome="cancelled"
    )
    figures = said + Counter({f"run {k}": n for k, n in runs.items()})
    figures["recovered into cancelled"] = recovered_cancelled.count()
    print(f"{tries} cancels on {alias}: {dict(sorted(figures.items()))}")
    # Every path the cancel races with was taken.
    assert said["cancelled"] and said["stopping"], said
    assert runs["paused"] and runs["retry"] and runs["lease_expired"], runs
    return figures


@pytest.mark.slow
@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_no_cancel_is_lost_among_checkpointing_retrying_and_recovered_jobs(
    alias: str, workers: Workers
) -> None:
    stress_cancels(alias, workers, tries=600 if alias == ALIAS else 200, seed=33)


@pytest.mark.thorough
@pytest.mark.timeout(1800)
@pytest.mark.django_db(transaction=True, databases=["default"])
def test_no_cancel_is_lost_in_ten_thousand_tries(workers: Workers) -> None:
    stress_cancels(ALIAS, workers, tries=10_000, seed=3333)
