"""Atomic handlers: the handler's writes and its verdict commit together, or not at all.

The real-process tests run on PostgreSQL only: a worker stopped inside a
SQLite write transaction would hold the whole file's write lock.
"""

from __future__ import annotations

import dataclasses
import signal
import uuid
from pathlib import Path

import pytest

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.testing import drain
from django_venturi.worker.inline import execute
from tests.conftest import Workers, wait_until
from tests.test_crashes import claim_one, stop_outside_transactions
from tests.testapp.models import Record
from tests.testapp.workflow_tasks import AtomicWrite

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def attempts_written(alias: str, job: Job) -> list[int]:
    records = Record.objects.using(alias).filter(job_id=job.pk, kind="atomic").order_by("id")
    return [record.attempt for record in records]


def outcomes(alias: str, job: Job) -> list[tuple[int, str]]:
    entries = JournalEntry.objects.using(alias).filter(job_id=job.pk).order_by("id")
    return list(entries.values_list("attempt", "outcome"))


def test_an_atomic_handler_commits_its_writes_with_its_verdict(alias: str) -> None:
    job = AtomicWrite().enqueue(using=alias)
    drain(using=alias)
    assert attempts_written(alias, job) == [1]
    assert outcomes(alias, job) == [(1, "completed")]
    assert Job.objects.using(alias).get(pk=job.pk).result == 1


def test_an_atomic_handler_that_raises_leaves_no_writes(alias: str) -> None:
    job = AtomicWrite(fail=True).enqueue(using=alias)
    drain(using=alias)
    assert attempts_written(alias, job) == []
    assert outcomes(alias, job) == [(1, "retry"), (2, "retry"), (3, "failed")]


def test_an_atomic_run_that_lost_its_claim_commits_nothing(alias: str) -> None:
    job = AtomicWrite().enqueue(using=alias)
    claimed = claim_one(alias, "stalled")
    # Recovered and claimed again elsewhere while the run was under way.
    Job.objects.using(alias).filter(pk=job.pk).update(claim_token=uuid.uuid4())

    ran = execute(alias, claimed)

    assert ran.outcome == venturi.JournalOutcome.DISCARDED
    assert attempts_written(alias, job) == []
    assert outcomes(alias, job) == [(1, "discarded")]
    assert Job.objects.using(alias).get(pk=job.pk).state == venturi.State.RUNNING


def test_an_atomic_task_needs_a_sync_handler() -> None:
    with pytest.raises(venturi.RegistrationError, match="atomic=True needs a sync handle"):

        @venturi.task(kind="tests.atomic.async", atomic=True)
        @dataclasses.dataclass
        class AsyncAtomic:
            async def handle(self, ctx: venturi.Context) -> venturi.Outcome:
                return venturi.Outcome.completed()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_stalled_atomic_run_rolls_back_when_another_worker_completed_the_job(
    workers: Workers, tmp_path: Path
) -> None:
    alias = "default"
    job = AtomicWrite(stall_in=str(tmp_path)).enqueue(using=alias)
    stalled = workers.start(alias)
    wait_until(lambda: (tmp_path / "written").exists(), message="the first run's write")
    stop_outside_transactions(alias, stalled)

    rescuer = workers.start(alias)
    wait_until(
        lambda: Job.objects.using(alias).get(pk=job.pk).state == venturi.State.COMPLETED,
        timeout=30,
        message="the second worker to recover and complete the job",
    )
    assert attempts_written(alias, job) == [2]

    (tmp_path / "go").touch()
    stalled.send_signal(signal.SIGCONT)
    wait_until(
        lambda: (1, "discarded") in outcomes(alias, job),
        timeout=30,
        message="the stalled run's late verdict",
    )
    assert outcomes(alias, job) == [(1, "lease_expired"), (2, "completed"), (1, "discarded")]
    assert attempts_written(alias, job) == [2]
    assert Job.objects.using(alias).get(pk=job.pk).result == 2
    assert stalled.poll() is None and rescuer.poll() is None


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_worker_killed_inside_an_atomic_handler_leaves_no_partial_writes(
    workers: Workers, tmp_path: Path
) -> None:
    alias = "default"
    job = AtomicWrite(stall_in=str(tmp_path)).enqueue(using=alias)
    doomed = workers.start(alias)
    wait_until(lambda: (tmp_path / "written").exists(), message="the first run's write")
    doomed.kill()
    assert doomed.wait(timeout=10) == -signal.SIGKILL

    workers.start(alias)
    wait_until(
        lambda: Job.objects.using(alias).get(pk=job.pk).state == venturi.State.COMPLETED,
        timeout=30,
        message="another worker to recover and complete the job",
    )
    assert attempts_written(alias, job) == [2]
    assert outcomes(alias, job) == [(1, "lease_expired"), (2, "completed")]
