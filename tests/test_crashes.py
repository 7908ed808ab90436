"""Crashes and races: SIGKILL, SIGSTOP, poison jobs, chaos, and recovery racing completion.

Real `venturi_worker` subprocesses against the test databases. The tasks used
here (tests/testapp/tasks.py) have short leases (2 s), so that a dead worker's
jobs come back quickly; tests/settings.py sweeps for expired leases every 0.5 s.
"""

from __future__ import annotations

import collections
import random
import signal
import sqlite3
import subprocess
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connections, transaction
from django.utils import timezone

import django_venturi as venturi
from django_venturi.conf import venturi_settings
from django_venturi.models import Job, JournalEntry
from django_venturi.registry import registry
from django_venturi.store import leases, verdicts
from django_venturi.store.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.store.completion import write_verdicts
from django_venturi.store.connections import connection_params
from django_venturi.store.scheduling import TierClock
from tests.conftest import Workers, in_thread, result_of, wait_until
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

LEASE = timedelta(seconds=2)
"""The lease of tests.chaos, tests.kills_its_worker and tests.slow_first."""


# ---------------------------------------------------------------- helpers


def job_row(alias: str, job_id: int) -> Job:
    return Job.objects.using(alias).get(pk=job_id)


def state_of(alias: str, job_id: int) -> str:
    return str(Job.objects.using(alias).values_list("state", flat=True).get(pk=job_id))


def journal(alias: str, job_id: int) -> list[JournalEntry]:
    return list(JournalEntry.objects.using(alias).filter(job_id=job_id).order_by("id"))


def outcomes(alias: str, job_id: int) -> list[str]:
    return [entry.outcome for entry in journal(alias, job_id)]


def runs(alias: str, job_id: int) -> list[Record]:
    return list(Record.objects.using(alias).filter(job_id=job_id).order_by("id"))


def database_now(alias: str) -> datetime:
    """The clock leases are measured with: PostgreSQL's now(), or this host's for SQLite."""
    if connections[alias].vendor != "postgresql":
        return timezone.now()
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    return now


def started_up(workers: Workers, index: int) -> bool:
    """The worker logged its start: its claim loop (and recovery sweeps) run from now on."""
    return " starting: " in workers.log(index)


def stopped(process: subprocess.Popen[bytes]) -> bool:
    """Whether the process is in the stopped state (after SIGSTOP)."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()
    return fields[0] == "T"


def sqlite_unlocked(alias: str) -> bool:
    """Whether another process could commit a write to the SQLite file now.

    `BEGIN EXCLUSIVE`, not `BEGIN IMMEDIATE`: in the rollback-journal mode the test
    database uses, a writer's commit waits for every reader's SHARED lock too, and
    IMMEDIATE only asks for the RESERVED lock, which a reader does not hold: a worker
    frozen mid-SELECT would pass it, and then block every commit of the worker meant
    to rescue its job.
    """
    probe = sqlite3.connect(connections[alias].settings_dict["NAME"], timeout=0.2)
    try:
        probe.execute("BEGIN EXCLUSIVE")
        probe.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def stop_outside_transactions(alias: str, process: subprocess.Popen[bytes]) -> None:
    """SIGSTOP `process`, retrying if it froze while holding a lock on the SQLite file.

    A process stopped inside a SQLite transaction or statement (a read's SHARED lock
    as much as a write's) blocks every other process's commits to that file: that is
    SQLite's single-host nature, not what this test is about. PostgreSQL's row locks
    do not have this problem here, since the stalled worker's own job is never locked
    by an open transaction of it.
    """
    for _ in range(50):
        process.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(process), timeout=5, message="the worker to stop")
        if connections[alias].vendor == "postgresql" or sqlite_unlocked(alias):
            return
        process.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the worker kept holding a lock on the SQLite file")


def claim_one(alias: str, worker: str, lease: timedelta = timedelta(seconds=30)) -> ClaimedJob:
    """Claim one due job as a worker named `worker` would, from the test process."""
    kinds = registry.kinds()
    request = ClaimRequest(
        worker=worker, limit=1, kinds=kinds, leases=[lease] * len(kinds), queues=None
    )
    (claimed,) = claim(alias, request, TierClock(venturi_settings.PRIORITY_WEIGHTS))
    return claimed


def expire_lease(alias: str, job_id: int) -> None:
    """Make the job's lease run out a minute ago (far beyond any clock skew)."""
    past = timezone.now() - timedelta(minutes=1)
    assert Job.objects.using(alias).filter(pk=job_id).update(lease_expires_at=past) == 1


def lock_waiters() -> int:
    """Backends of the test database waiting for a row lock."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        (count,) = cursor.fetchone()
    return int(count)


# ---------------------------------------------------------------- SIGKILL


def test_a_sigkilled_workers_job_is_recovered_by_a_live_worker_after_its_lease(
    alias: str, workers: Workers
) -> None:
    job = tasks.SlowFirst(first=60, then=0.1).enqueue(using=alias)
    doomed = workers.start(alias)
    first_run = wait_until(
        lambda: Record.objects.using(alias).filter(job_id=job.pk).first(),
        message="the job to start on the first worker",
    )
    assert first_run.value == doomed.pid
    held = job_row(alias, job.pk)
    assert held.state == venturi.State.RUNNING and f":{doomed.pid}:" in held.claimed_by

    rescuer = workers.start(alias)
    wait_until(lambda: started_up(workers, 1), message="the second worker to start")
    # While its worker lives, heartbeats keep the lease: the second worker's
    # recovery sweeps (every 0.5 s) leave the job alone, well past one lease.
    wait_until(
        lambda: database_now(alias) - held.started_at > 2 * LEASE,
        timeout=15,
        message="two lease lengths to pass",
    )
    alive = job_row(alias, job.pk)
    assert alive.state == venturi.State.RUNNING
    assert alive.claim_token == held.claim_token and alive.attempt == 1
    assert alive.lease_expires_at > held.lease_expires_at  # extended by heartbeats
    assert outcomes(alias, job.pk) == []

    doomed.kill()
    assert doomed.wait(timeout=10) == -signal.SIGKILL
    last_lease = job_row(alias, job.pk).lease_expires_at
    wait_until(
        lambda: state_of(alias, job.pk) == venturi.State.COMPLETED,
        timeout=30,
        message="the second worker to recover and complete the job",
    )

    lost, done = journal(alias, job.pk)
    assert (lost.outcome, done.outcome) == ("lease_expired", "completed")
    assert lost.attempt == 1 and lost.worker == held.claimed_by
    assert lost.error_type == "django_venturi.LeaseExpired"
    assert held.claimed_by in lost.error_message
    assert lost.finished_at >= last_lease  # recovered only once the lease had run out
    assert done.attempt == 2 and f":{rescuer.pid}:" in done.worker
    final = job_row(alias, job.pk)
    assert (final.attempt, final.failures) == (2, 1)
    assert final.claim_token is None and final.lease_expires_at is None
    assert [run.value for run in runs(alias, job.pk)] == [doomed.pid, rescuer.pid]
    assert [run.attempt for run in runs(alias, job.pk)] == [1, 2]

    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(timeout=20) == 0


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_an_idle_worker_with_a_long_poll_interval_still_recovers_on_time(
    workers: Workers,
) -> None:
    """RESCUE_INTERVAL (0.5 s here) drives recovery, not the poll interval (an hour)."""
    alias = "default"
    job = tasks.SlowFirst(first=60, then=0.1).enqueue(using=alias)
    doomed = workers.start(alias)
    wait_until(lambda: runs(alias, job.pk), message="the job to start")
    rescuer = workers.start(alias, "--poll-interval", "3600")
    wait_until(lambda: started_up(workers, 1), message="the second worker to start")
    doomed.kill()
    doomed.wait(timeout=10)
    expires = job_row(alias, job.pk).lease_expires_at
    # Nothing wakes the rescuer before its poll an hour away but its lease sweeps.
    wait_until(lambda: outcomes(alias, job.pk), timeout=60, message="the recovery")
    (lost,) = journal(alias, job.pk)
    assert lost.outcome == "lease_expired"
    assert lost.finished_at >= expires
    assert rescuer.poll() is None


# ---------------------------------------------------------------- SIGSTOP


def test_a_stalled_worker_cannot_overwrite_the_reclaimed_job(alias: str, workers: Workers) -> None:
    job = tasks.SlowFirst(first=1.5, then=0.1).enqueue(using=alias)
    stalled = workers.start(alias)
    wait_until(lambda: runs(alias, job.pk), message="the job to start")
    stop_outside_transactions(alias, stalled)
    held = job_row(alias, job.pk)
    assert held.state == venturi.State.RUNNING and f":{stalled.pid}:" in held.claimed_by

    rescuer = workers.start(alias)
    wait_until(
        lambda: state_of(alias, job.pk) == venturi.State.COMPLETED,
        timeout=30,
        message="the second worker to reclaim and complete the job",
    )
    done = job_row(alias, job.pk)
    assert outcomes(alias, job.pk) == ["lease_expired", "completed"]

    stalled.send_signal(signal.SIGCONT)
    # Its handler returns `completed` for attempt 1: fenced off, journalled as discarded.
    wait_until(
        lambda: len(outcomes(alias, job.pk)) == 3,
        timeout=20,
        message="the stalled worker's late result",
    )
    lost, completed, late = journal(alias, job.pk)
    assert (lost.outcome, completed.outcome, late.outcome) == (
        "lease_expired",
        "completed",
        "discarded",
    )
    assert lost.attempt == late.attempt == 1 and completed.attempt == 2
    assert late.worker == held.claimed_by and f":{rescuer.pid}:" in completed.worker
    after = job_row(alias, job.pk)
    assert after.state == venturi.State.COMPLETED
    assert (after.attempt, after.failures, after.finished_at) == (2, 1, done.finished_at)
    assert after.claimed_by == done.claimed_by and after.claim_token is None
    assert [run.attempt for run in runs(alias, job.pk)] == [1, 2]

    # The stalled worker lives on, and works: a fresh job is done by one of the two.
    assert stalled.poll() is None and rescuer.poll() is None
    fresh = tasks.Noop(n=7).enqueue(using=alias)
    wait_until(lambda: state_of(alias, fresh.pk) == venturi.State.COMPLETED)
    for process in (stalled, rescuer):
        process.send_signal(signal.SIGTERM)
    assert stalled.wait(timeout=20) == 0 and rescuer.wait(timeout=20) == 0


# ---------------------------------------------------------------- poison


def test_a_job_that_always_kills_its_worker_ends_failed_after_max_attempts(
    alias: str, workers: Workers, tmp_path: Path
) -> None:
    poison = tasks.KillsItsWorker().enqueue(using=alias)
    bystanders = venturi.enqueue_many(
        [tasks.Chaos(path=str(tmp_path / "runs.log")) for _ in range(5)], using=alias
    )
    dead: list[int] = []
    deadline = time.monotonic() + 60
    while state_of(alias, poison.pk) != venturi.State.FAILED:
        assert time.monotonic() < deadline, f"still {state_of(alias, poison.pk)} after 60 s"
        assert len(dead) <= 3, "the poison job ran more than max_attempts times"
        process = workers.start(alias)
        wait_until(
            lambda process=process: (
                process.poll() is not None or state_of(alias, poison.pk) == venturi.State.FAILED
            ),
            timeout=30,
            message="the worker to die or the poison job to give up",
        )
        if process.poll() is not None:
            assert process.returncode == -signal.SIGKILL
            dead.append(process.pid)

    assert len(dead) == 3
    survivor = workers.processes[-1]
    assert survivor.poll() is None  # the worker that recovered the last attempt lives on
    assert outcomes(alias, poison.pk) == ["lease_expired"] * 3
    final = job_row(alias, poison.pk)
    assert (final.attempt, final.failures) == (3, 3)
    assert "gave up after 3 failed attempts (max_attempts=3)" in final.last_error
    assert final.finished_at is not None and final.claim_token is None
    assert [(run.attempt, run.value) for run in runs(alias, poison.pk)] == [
        (1, dead[0]),
        (2, dead[1]),
        (3, dead[2]),
    ]
    # The jobs claimed alongside the poison are not lost.
    for job in bystanders:
        wait_until(lambda job=job: state_of(alias, job.pk) == venturi.State.COMPLETED)
        assert outcomes(alias, job.pk).count("completed") == 1
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(timeout=20) == 0


# ---------------------------------------------------------------- chaos

CHAOS_JOBS = 2000
CHAOS_UP_FRONT = 800
"""Jobs enqueued before the workers start; the rest arrive during the chaos."""
CHAOS_ARRIVALS = 60
"""Jobs enqueued at each kill, so that work goes on through the whole chaos."""
CHAOS_WORKERS = 3
CHAOS_MIN_SECONDS = 22
CHAOS_MAX_SECONDS = 35
CHAOS_HANDLER_SLEEP = 0.05


@pytest.mark.thorough  # 20 s; CI's chaos soak (benchmarks/chaos.py) kills workers too
@pytest.mark.django_db(transaction=True, databases=["default"])
def test_chaos_every_job_completes_and_every_attempt_is_accounted_for(
    workers: Workers, tmp_path: Path
) -> None:
    alias = "default"
    side_effects = tmp_path / "runs.log"

    def enqueue(count: int) -> set[int]:
        chaos = tasks.Chaos(path=str(side_effects), sleep=CHAOS_HANDLER_SLEEP)
        return {job.pk for job in venturi.enqueue_many([chaos] * count, using=alias)}

    def remaining() -> int:
        return Job.objects.using(alias).exclude(state=venturi.State.COMPLETED).count()

    ids = enqueue(CHAOS_UP_FRONT)
    worker_args = ("--concurrency", "3", "--shutdown-timeout", "5")
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    live = [workers.start(alias, *worker_args) for _ in range(CHAOS_WORKERS)]
    killed: list[subprocess.Popen[bytes]] = []
    begun = time.monotonic()
    # One SIGKILL about every second, for at least CHAOS_MIN_SECONDS and while work is left.
    while time.monotonic() - begun < CHAOS_MAX_SECONDS and (
        time.monotonic() - begun < CHAOS_MIN_SECONDS or len(ids) < CHAOS_JOBS or remaining()
    ):
        time.sleep(rng.uniform(0.7, 1.3))
        if len(ids) < CHAOS_JOBS:
            ids |= enqueue(min(CHAOS_ARRIVALS, CHAOS_JOBS - len(ids)))
        victim = rng.choice(live)
        victim.kill()
        victim.wait(timeout=10)
        killed.append(victim)
        live.remove(victim)
        live.append(workers.start(alias, *worker_args))
        assert all(process.poll() is None for process in live), "a worker died on its own"
    chaos_seconds = time.monotonic() - begun
    left_at_end_of_chaos = remaining()
    wait_until(lambda: not remaining(), timeout=30, message="every job to complete")
    total_seconds = time.monotonic() - begun
    assert all(process.returncode == -signal.SIGKILL for process in killed)
    assert all(process.poll() is None for process in live), "a worker died on its own"
    for process in live:
        # Before Django is set up, SIGTERM would kill it as any process: wait for the start.
        wait_until(lambda process=process: started_up(workers, workers.processes.index(process)))
        process.send_signal(signal.SIGTERM)
    assert [process.wait(timeout=20) for process in live] == [0] * len(live)

    # What each run left behind: one line per run that reached the handler.
    side_effect_runs: dict[int, list[int]] = collections.defaultdict(list)
    for line in side_effects.read_text().splitlines():
        job_id, attempt, _pid = (int(part) for part in line.split())
        side_effect_runs[job_id].append(attempt)
    entries: dict[int, list[JournalEntry]] = collections.defaultdict(list)
    for entry in JournalEntry.objects.using(alias).order_by("id"):
        entries[entry.job_id].append(entry)
    rows = {job.pk: job for job in Job.objects.using(alias)}

    assert len(ids) == CHAOS_JOBS and set(rows) == ids
    lost = [job_id for job_id in ids if rows[job_id].state != venturi.State.COMPLETED]
    assert not lost
    duplicated_jobs = 0
    extra_runs = 0
    lost_claims_without_run = 0
    discarded = 0
    for job_id in sorted(ids):
        job = rows[job_id]
        closing = [entry for entry in entries[job_id] if entry.outcome != "discarded"]
        late = [entry for entry in entries[job_id] if entry.outcome == "discarded"]
        context = f"job {job_id}: {[(e.attempt, e.outcome) for e in entries[job_id]]}"
        # Every claim counted an attempt, and each claim is closed by exactly one entry.
        attempts = sorted(entry.attempt for entry in closing)
        assert attempts == list(range(1, job.attempt + 1)), context
        assert [entry.outcome for entry in closing] == ["lease_expired"] * (job.attempt - 1) + [
            "completed"
        ], context
        assert closing[-1].attempt == job.attempt, context
        assert job.failures == job.attempt - 1, context
        # A late result of a stale claim only exists for a claim recovered as lost.
        lost_attempts = {entry.attempt for entry in closing if entry.outcome == "lease_expired"}
        assert {entry.attempt for entry in late} <= lost_attempts, context
        discarded += len(late)
        # Side effects: each run belongs to one claim, at most one run per claim, the
        # completing run among them; any other run belongs to a claim journalled as lost.
        ran = side_effect_runs[job_id]
        assert len(ran) == len(set(ran)), f"{context}, runs {ran}"
        assert job.attempt in ran, f"{context}, runs {ran}"
        assert set(ran) - {job.attempt} <= lost_attempts, f"{context}, runs {ran}"
        assert len(ran) <= len(closing)
        lost_claims_without_run += len(lost_attempts - set(ran))
        if len(ran) > 1:
            duplicated_jobs += 1
            extra_runs += len(ran) - 1
    assert set(side_effect_runs) == ids
    lease_expired = sum(
        1 for job_entries in entries.values() for e in job_entries if e.outcome == "lease_expired"
    )
    print(
        f"\nchaos: {CHAOS_JOBS} jobs, {CHAOS_WORKERS} workers, {len(killed)} SIGKILLs over "
        f"{chaos_seconds:.1f} s ({left_at_end_of_chaos} jobs left when the kills stopped), "
        f"all done after {total_seconds:.1f} s (seed {seed}).\n"
        f"chaos: lost {len(lost)}; lease_expired entries {lease_expired}; jobs run more than "
        f"once {duplicated_jobs} ({extra_runs} duplicated runs); claims lost before the handler "
        f"ran {lost_claims_without_run}; discarded late results {discarded}"
    )
    assert len(killed) >= 15
    assert lease_expired >= 1


# ---------------------------------------------------------------- recovery racing completion


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_late_completion_holding_the_row_wins_and_recovery_skips_it() -> None:
    alias = "default"
    job = tasks.Noop(n=1).enqueue(using=alias)
    claimed = claim_one(alias, "late-worker")
    assert claimed.id == job.pk
    expire_lease(alias, job.pk)

    locker = psycopg.connect(**connection_params(alias))
    try:
        table = Job._meta.db_table
        locker.execute(f'SELECT id FROM "{table}" WHERE id = %s FOR UPDATE', [job.pk])
        # The sweep sees an expired running job, but its row is locked: SKIP it.
        recovery, recovery_box = in_thread(leases.recover_expired, alias, "rescuer")
        assert result_of(recovery, recovery_box) == []
        # The late completion waits for the lock...
        late, late_box = in_thread(
            write_verdicts, alias, "late-worker", [verdicts.completed(claimed)]
        )
        wait_until(lambda: lock_waiters() >= 1, timeout=10, message="the write to block")
        assert late.is_alive()
    finally:
        locker.commit()
        locker.close()
    # ...then is applied: its claim token is still current.
    assert result_of(late, late_box) == {job.pk}
    done = job_row(alias, job.pk)
    assert done.state == venturi.State.COMPLETED and outcomes(alias, job.pk) == ["completed"]

    # Later sweeps find nothing to do, and never rewrite the finished job.
    assert leases.recover_expired(alias, "rescuer") == []
    again = job_row(alias, job.pk)
    assert (again.state, again.finished_at, again.failures) == (
        venturi.State.COMPLETED,
        done.finished_at,
        0,
    )
    assert outcomes(alias, job.pk) == ["completed"]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_late_completion_inside_its_transaction_makes_recovery_skip_the_row() -> None:
    """The completion's own UPDATE holds the row lock while the sweep runs."""
    alias = "default"
    job = tasks.Noop(n=2).enqueue(using=alias)
    claimed = claim_one(alias, "late-worker")
    expire_lease(alias, job.pk)
    written = threading.Event()
    commit = threading.Event()

    def complete_and_hold() -> set[int]:
        with transaction.atomic(using=alias):
            applied = write_verdicts(alias, "late-worker", [verdicts.completed(claimed)])
            written.set()
            assert commit.wait(10)
        return applied

    late, late_box = in_thread(complete_and_hold)
    try:
        assert written.wait(10)
        recovery, recovery_box = in_thread(leases.recover_expired, alias, "rescuer")
        assert result_of(recovery, recovery_box) == []
    finally:
        commit.set()
    assert result_of(late, late_box) == {job.pk}
    assert state_of(alias, job.pk) == venturi.State.COMPLETED
    assert leases.recover_expired(alias, "rescuer") == []
    assert outcomes(alias, job.pk) == ["completed"]


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_recovery_holding_the_row_first_makes_the_late_completion_discarded() -> None:
    alias = "default"
    job = tasks.Noop(n=3).enqueue(using=alias)
    claimed = claim_one(alias, "late-worker")
    expire_lease(alias, job.pk)
    recovered = threading.Event()
    commit = threading.Event()

    def recover_and_hold() -> list[int]:
        with transaction.atomic(using=alias):  # the sweep's row locks last until this commits
            ids = leases.recover_expired(alias, "rescuer")
            recovered.set()
            assert commit.wait(10)
        return ids

    recovery, recovery_box = in_thread(recover_and_hold)
    try:
        assert recovered.wait(10)
        late, late_box = in_thread(
            write_verdicts, alias, "late-worker", [verdicts.completed(claimed)]
        )
        wait_until(lambda: lock_waiters() >= 1, timeout=10, message="the write to block")
        assert late.is_alive()
    finally:
        commit.set()
    assert result_of(recovery, recovery_box) == [job.pk]
    # The late completion re-reads the row after the sweep committed: the token is gone.
    assert result_of(late, late_box) == set()
    row = job_row(alias, job.pk)
    assert row.state == venturi.State.READY and (row.attempt, row.failures) == (1, 1)
    assert row.finished_at is None and row.claim_token is None
    assert outcomes(alias, job.pk) == ["lease_expired", "discarded"]


def test_after_recovery_a_late_result_never_touches_the_job_again(alias: str) -> None:
    """Recovery, then the stale completion, then a new claim completes, then an even later one."""
    job = tasks.Noop(n=4).enqueue(using=alias)
    stale = claim_one(alias, "stale-worker")
    expire_lease(alias, job.pk)
    assert leases.recover_expired(alias, "rescuer") == [job.pk]
    assert write_verdicts(alias, "stale-worker", [verdicts.completed(stale)]) == set()
    row = job_row(alias, job.pk)
    assert row.state == venturi.State.READY and row.finished_at is None

    Job.objects.using(alias).filter(pk=job.pk).update(
        run_at=timezone.now() - timedelta(minutes=1)
    )  # skip the backoff
    fresh = claim_one(alias, "fresh-worker")
    assert (fresh.id, fresh.attempt) == (job.pk, 2)
    assert write_verdicts(alias, "fresh-worker", [verdicts.completed(fresh)]) == {job.pk}
    done = job_row(alias, job.pk)
    # Both the stale claim and the fresh one, finished, cannot be written again.
    for late in (stale, fresh):
        failure = verdicts.failed(late, verdicts.ErrorInfo.from_reason("late", type="Late"))
        assert write_verdicts(alias, "late", [failure]) == set()
        assert leases.recover_expired(alias, "rescuer") == []
    after = job_row(alias, job.pk)
    assert (after.state, after.finished_at, after.failures, after.last_error) == (
        venturi.State.COMPLETED,
        done.finished_at,
        1,
        done.last_error,
    )
    assert outcomes(alias, job.pk) == [
        "lease_expired",
        "discarded",
        "completed",
        "discarded",
        "discarded",
    ]


def test_concurrent_sweeps_recover_each_expired_claim_exactly_once(alias: str) -> None:
    venturi.enqueue_many([tasks.Noop(n=i) for i in range(250)], using=alias)
    kinds = registry.kinds()
    request = ClaimRequest(
        worker="vanished", limit=250, kinds=kinds, leases=[LEASE] * len(kinds), queues=None
    )
    assert len(claim(alias, request, TierClock(venturi_settings.PRIORITY_WEIGHTS))) == 250
    Job.objects.using(alias).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    barrier = threading.Barrier(8)

    def sweep(name: str) -> list[int]:
        barrier.wait()
        recovered: list[int] = []
        while batch := leases.recover_expired(alias, name):
            recovered.extend(batch)
        return recovered

    sweepers = [in_thread(sweep, f"sweeper-{i}") for i in range(8)]
    recovered = [job_id for thread, box in sweepers for job_id in result_of(thread, box, 60)]
    assert len(recovered) == len(set(recovered)) == 250
    entries = JournalEntry.objects.using(alias)
    assert entries.count() == entries.filter(outcome="lease_expired").count() == 250
    assert len(set(entries.values_list("job_id", flat=True))) == 250
    assert Job.objects.using(alias).filter(state=venturi.State.READY, failures=1).count() == 250
