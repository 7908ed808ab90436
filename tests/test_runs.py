"""A worker's bookkeeping of its runs: keyed by claim, one verdict per run."""

from __future__ import annotations

import re
import threading
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from django_venturi.store.claim import ClaimedJob
from django_venturi.worker.execution import Execution
from django_venturi.worker.runs import Runs


def run_of(job_id: int, token: uuid.UUID | None = None) -> Execution:
    now = timezone.now()
    job = ClaimedJob(
        id=job_id,
        kind="tests.noop",
        queue="default",
        priority=1,
        payload={},
        carry=None,
        attempt=1,
        failures=0,
        enqueued_at=now,
        started_at=now,
        claim_token=token or uuid.uuid4(),
        lease=timedelta(seconds=5),
    )
    return Execution(job, database="default", stop=threading.Event(), heartbeat=lambda e: True)


def test_a_stale_run_and_a_live_run_of_one_job_are_two_runs() -> None:
    runs = Runs()
    stale, live = run_of(7), run_of(7)
    runs.add(stale)
    assert runs.start(stale)
    runs.add(live)  # the same job, claimed again while the stale handler is inside
    assert runs.start(live)
    assert runs.busy() == 2
    assert runs.end(stale)
    runs.written([stale.job])
    assert runs.held() == [live] and runs.executing() == [live]
    assert runs.busy() == 1


def test_a_run_is_ended_once_whoever_comes_first() -> None:
    runs = Runs()
    execution = run_of(1)
    runs.add(execution)
    assert runs.start(execution)
    assert runs.take_executing() == [execution]  # a release at shutdown decides it
    assert not runs.end(execution)  # the handler returning later does not
    assert runs.unwritten() == 1
    runs.written([execution.job])
    assert runs.idle()


def test_a_released_queued_run_is_never_started() -> None:
    runs = Runs()
    execution = run_of(1)
    runs.add(execution)
    assert runs.take_queued() == [execution]
    assert not runs.start(execution)


def test_runs_are_found_by_job_for_a_cancel_request() -> None:
    runs = Runs()
    first, second, other = run_of(3), run_of(3), run_of(4)
    for execution in (first, second, other):
        runs.add(execution)
    assert set(map(id, runs.held_by_job([3]))) == {id(first), id(second)}
    assert runs.held_kinds() == {"tests.noop": 3}


def test_a_worker_name_the_database_cannot_store_is_refused() -> None:
    from django_venturi.worker.process import Worker

    for name, says in (("w\x00", "NUL"), ("w" * 201, "201 characters"), ("\udc80", "U+DC80")):
        with pytest.raises(ValueError, match=re.escape(says)):
            Worker(name=name)
