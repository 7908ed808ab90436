"""The worker under what production does to it: other sessions' locks, stalls, refused
writes and a part of the worker that dies. Real `venturi_worker` processes, PostgreSQL.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.db.models import OuterRef, Subquery

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry, WorkerProcess
from django_venturi.store import leases
from django_venturi.store.clock import database_time, now_expression
from tests.conftest import Workers, in_thread, result_of, wait_until, worker_env
from tests.testapp import tasks
from tests.testapp.hardening_tasks import HeldKey
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

ALIAS = "default"


def runs_of(job_id: int) -> list[int]:
    """The attempts whose handler started, from the handlers' own records."""
    return sorted(
        Record.objects.using(ALIAS).filter(job_id=job_id).values_list("attempt", flat=True)
    )


def outcomes_of(job_id: int) -> list[str]:
    return list(
        JournalEntry.objects.using(ALIAS)
        .filter(job_id=job_id)
        .order_by("id")
        .values_list("outcome", flat=True)
    )


def state_of(job_id: int) -> str:
    return str(Job.objects.using(ALIAS).values_list("state", flat=True).get(pk=job_id))


def lease_of(job_id: int) -> datetime:
    expires = Job.objects.using(ALIAS).values_list("lease_expires_at", flat=True).get(pk=job_id)
    assert expires is not None, f"job {job_id} holds no lease"
    return expires


def clock_time() -> datetime:
    """The database's time now, even inside a transaction (whose `now()` stands still)."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (now,) = cursor.fetchone()
    return now


def test_a_producers_row_lock_costs_no_job_its_lease(workers: Workers, tmp_path: Path) -> None:
    """A keyed enqueue that merges into a running job holds that row locked until the
    producer commits. The worker's heartbeat skips the row instead of waiting for it: the
    other job it runs keeps its lease, and so does the locked one, since its worker
    keeps beating. Before, the one heartbeat statement waited behind the lock and both
    3 s leases ran out during the producer's transaction: the jobs ran twice."""
    gate = tmp_path / "gate"
    keyed = HeldKey(key="locked", gate=str(gate)).enqueue(using=ALIAS)
    other = HeldKey(key="free", gate=str(gate)).enqueue(using=ALIAS)
    workers.start(ALIAS, "--concurrency", "4")
    wait_until(lambda: runs_of(keyed.pk) and runs_of(other.pk), timeout=30)

    def producer() -> None:
        with transaction.atomic(using=ALIAS):
            merged = HeldKey(key="locked").enqueue(using=ALIAS)
            assert merged.pk == keyed.pk  # merged into the running job: its row is locked
            locked_lease = lease_of(keyed.pk)
            # Held until the locked job's lease has run out, and the worker's heartbeat
            # has carried the other job's lease past that moment (it skipped the row).
            wait_until(
                lambda: clock_time() > locked_lease and lease_of(other.pk) > locked_lease,
                message="the lease to run out while the row is locked, the other extended",
            )

    thread, box = in_thread(producer)
    result_of(thread, box, timeout=60)
    gate.touch()
    wait_until(
        lambda: state_of(keyed.pk) == state_of(other.pk) == venturi.State.COMPLETED, timeout=30
    )
    assert (runs_of(keyed.pk), runs_of(other.pk)) == ([1], [1]), workers.log()
    assert (outcomes_of(keyed.pk), outcomes_of(other.pk)) == (["completed"], ["completed"])


def test_a_stale_run_ending_leaves_the_live_run_of_the_same_job_alone(
    workers: Workers,
) -> None:
    """The whole worker stalls past the lease (SIGSTOP); the job is recovered and the same
    worker claims it again while the stale run's handler is still inside. The stale run's
    end is discarded and touches nothing of the live run, which keeps being heartbeated
    and completes. Before, the bookkeeping was keyed by job id: the stale end removed the
    live run, which lost its lease, ran again, and so on until max_attempts."""
    job = tasks.SlowFirst(first=5, then=7).enqueue(using=ALIAS, queue="stall")
    worker = workers.start(ALIAS, "--queues", "stall", "--concurrency", "2")
    wait_until(lambda: runs_of(job.pk) == [1], timeout=30)
    worker.send_signal(signal.SIGSTOP)
    try:
        expired = Job.objects.using(ALIAS).filter(
            pk=job.pk, lease_expires_at__lt=now_expression(ALIAS)
        )
        wait_until(expired.exists, timeout=10, message="the lease to run out")
        # The worker is silent since its lease ran out: anyone may recover the job.
        assert leases.recover_expired(ALIAS, "rescuer") == [job.pk]
    finally:
        worker.send_signal(signal.SIGCONT)
    wait_until(lambda: state_of(job.pk) == venturi.State.COMPLETED, timeout=30)
    assert runs_of(job.pk) == [1, 2], workers.log()
    assert outcomes_of(job.pk) == ["lease_expired", "discarded", "completed"], workers.log()
    assert "lease_expired" not in outcomes_of(job.pk)[1:]


@pytest.fixture
def refuse_completing_13() -> Iterator[None]:
    """A trigger that makes PostgreSQL refuse to complete the job whose payload n is 13."""
    table = connections[ALIAS].ops.quote_name(Job._meta.db_table)
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION venturi_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'refused by a test trigger' USING ERRCODE = '22023';
            END $$
            """
        )
        cursor.execute(
            f"CREATE TRIGGER venturi_test_refuse BEFORE UPDATE ON {table} FOR EACH ROW "
            "WHEN (NEW.state = 'completed' AND OLD.payload->>'n' = '13') "
            "EXECUTE FUNCTION venturi_test_refuse()"
        )
    try:
        yield
    finally:
        with connections[ALIAS].cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS venturi_test_refuse ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS venturi_test_refuse()")


def test_a_verdict_the_database_refuses_fails_that_run_and_no_other(
    workers: Workers, refuse_completing_13: None
) -> None:
    """The database refuses one verdict of a batch (a DataError from a trigger): the
    others are written, the refused one becomes a failed run saying why, and the burst
    worker exits 0. Before, the results writer's thread died on the error: no verdict
    was written again, and the burst worker never exited."""
    jobs = venturi.enqueue_many([tasks.Steady(n=n, sleep=0) for n in range(30)], using=ALIAS)
    workers.burst(ALIAS, "--concurrency", "4", timeout=60)
    states = dict(Job.objects.using(ALIAS).values_list("pk", "state"))
    refused = jobs[13].pk
    assert states.pop(refused) == venturi.State.FAILED
    assert set(states.values()) == {venturi.State.COMPLETED}
    row = Job.objects.using(ALIAS).get(pk=refused)
    assert row.last_error.startswith("django_venturi.UnwritableVerdict: ")
    assert "refused by a test trigger" in row.last_error
    assert outcomes_of(refused) == ["failed"]


def test_a_service_that_dies_stops_the_worker_non_zero_and_hands_back_its_jobs(
    workers: Workers,
) -> None:
    """A `job_finished` receiver raises SystemExit, which ends the results writer's
    thread. The supervisor sees it: the worker stops claiming, hands back what it holds
    and exits non-zero with one clear line; a healthy worker then runs every job."""
    jobs = venturi.enqueue_many([tasks.Steady(n=n, sleep=0.05) for n in range(20)], using=ALIAS)
    env = {**worker_env(), "VENTURI_TEST_BREAK_RESULTS": "1"}
    broken = subprocess.run(
        workers.command(ALIAS, "--concurrency", "2"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert broken.returncode != 0, broken.stderr
    assert broken.stderr.count("stops: the worker's results died") == 1, broken.stderr
    ids = [job.pk for job in jobs]
    running = Job.objects.using(ALIAS).filter(pk__in=ids, state=venturi.State.RUNNING)
    assert not running.exists(), "the dead worker left jobs held"
    workers.burst(ALIAS, "--concurrency", "2", timeout=60)
    done = Job.objects.using(ALIAS).filter(pk__in=ids, state=venturi.State.COMPLETED)
    assert done.count() == len(ids)


def test_recovery_leaves_alone_a_lease_that_ran_out_just_after_its_worker_beat(
    workers: Workers,
) -> None:
    """The lease of a running job runs out (as when another session held its row) right
    after its worker's last beat: the worker is alive (it beat within its grace of two
    heartbeat intervals), so no one recovers the job, and the worker extends it again."""
    job = tasks.Sleeper(seconds=4, cooperative=False).enqueue(using=ALIAS)
    workers.start(ALIAS)
    wait_until(lambda: runs_of(job.pk), timeout=30)
    beat = WorkerProcess.objects.using(ALIAS).filter(name=OuterRef("claimed_by"))
    Job.objects.using(ALIAS).filter(pk=job.pk).update(
        lease_expires_at=Subquery(beat.values("heartbeat_at")) + timedelta(milliseconds=1)
    )
    row = Job.objects.using(ALIAS).get(pk=job.pk)
    assert row.lease_expires_at is not None
    assert leases.recover_expired(ALIAS, "rescuer") == []
    wait_until(lambda: state_of(job.pk) == venturi.State.COMPLETED, timeout=30)
    assert outcomes_of(job.pk) == ["completed"]


def test_a_silent_workers_lease_is_recovered_as_soon_as_it_runs_out() -> None:
    """A worker that last beat more than its grace before its job's lease ran out is
    gone (killed, paused): its job is recovered, even though its row says `running`."""
    job = tasks.Noop().enqueue(using=ALIAS)
    now = database_time(ALIAS)
    WorkerProcess.objects.using(ALIAS).create(
        name="silent",
        host="h",
        pid=1,
        concurrency=1,
        heartbeat_at=now - timedelta(seconds=3),
        heartbeat_grace=timedelta(seconds=2),
    )
    Job.objects.using(ALIAS).filter(pk=job.pk).update(
        state=venturi.State.RUNNING,
        attempt=1,
        claim_token=uuid.uuid4(),
        claimed_by="silent",
        started_at=now - timedelta(seconds=5),
        lease_expires_at=now - timedelta(milliseconds=500),
    )
    assert leases.recover_expired(ALIAS, "rescuer") == [job.pk]
    assert outcomes_of(job.pk) == ["lease_expired"]
