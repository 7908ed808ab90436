"""A read-only window under real workers: no finished result is lost or turned into a failure.

A failover leaves clients on a demoted primary that refuses every write with
SQLSTATE 25006 until they reconnect elsewhere. Here a private cluster's writes are
refused for a few seconds (`default_transaction_read_only`, as a demoted primary
answers) while three workers drain one-attempt jobs with the default lease: every
verdict refused in the window must be kept and written once writes are accepted
again, so every job completes, once, within seconds, and none fails.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections
from django.db.models import Count
from pytest_django import DjangoDbBlocker

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from tests import clusters
from tests.cluster_workers import DATABASE, WorkerPool, cluster_database, environment
from tests.conftest import wait_until
from tests.testapp.soak_tasks import Gated, Once

ALIAS = "read_only"
JOBS = 1500
READ_ONLY_AT = 300
"""Completed jobs before the test looks for the end of the drain."""
HELD = 3
"""Jobs running, held by a gate, when writes start being refused (each worker has 4
slots, so all three run whichever worker claims them)."""
WINDOW = 3.0
"""Seconds writes are refused."""
AFTER_WINDOW = 30.0
"""Seconds for every job to complete once writes are accepted again (the lease is 5 min)."""


@pytest.fixture
def cluster(django_db_blocker: DjangoDbBlocker) -> Iterator[clusters.Cluster]:
    with django_db_blocker.unblock(), cluster_database("readonly", ALIAS) as cluster:
        yield cluster


def states() -> dict[str, int]:
    return dict(Job.objects.using(ALIAS).values_list("state").annotate(n=Count("id")))


def test_verdicts_refused_in_a_read_only_window_are_written_once_it_ends(
    cluster: clusters.Cluster, tmp_path: Path
) -> None:
    path, gate = tmp_path / "runs.log", tmp_path / "gate"
    jobs = venturi.enqueue_many([Once(path=str(path))] * JOBS, using=ALIAS)
    # Enqueued last, so they run once the drain is done, and held until the window is on:
    # their verdicts are certainly refused (the drain alone can end before the reload
    # reaches every session).
    held = venturi.enqueue_many(
        [Gated(path=str(path), gate=str(gate)) for _ in range(HELD)], using=ALIAS
    )
    ids = {job.pk for job in [*jobs, *held]}
    pool = WorkerPool(tmp_path, environment(cluster.url(DATABASE)), "--concurrency", "4")
    pool.start(3)
    try:
        wait_until(
            lambda: states().get(venturi.State.COMPLETED, 0) >= READ_ONLY_AT,
            timeout=60,
            message=f"{READ_ONLY_AT} jobs completed",
        )
        wait_until(
            lambda: path.exists() and len(path.read_text().splitlines()) == JOBS + HELD,
            timeout=60,
            message="the drain done and the held jobs running",
        )
        cluster.set_read_only(True)
        try:
            # The fence: a transaction begun before the reload may still commit; none
            # begun after it can.
            cluster.wait_transactions_end(cluster.clock())
            connections[ALIAS].close()
            completed_in_window = states().get(venturi.State.COMPLETED, 0)
            gate.touch()
            # The scenario: workers hold runs whose verdicts the server refuses.
            wait_until(
                lambda: "read-only transaction" in pool.logs(),
                timeout=WINDOW * 3,
                message="a worker's write refused as read-only",
            )
            time.sleep(WINDOW)  # the fault's length, not a wait for the workers
        finally:
            cluster.set_read_only(False)
        assert completed_in_window <= JOBS, "a held job completed before its gate opened"
        assert states().get(venturi.State.COMPLETED, 0) == completed_in_window, (
            "a verdict was written while the server refused writes"
        )
        wait_until(
            lambda: states().get(venturi.State.COMPLETED, 0) == JOBS + HELD,
            timeout=AFTER_WINDOW,
            message=f"every job completed: {states()}",
        )
        assert not pool.exited(), pool.logs()
        codes = pool.stop()
    finally:
        pool.kill_all()
    assert codes == [0, 0, 0], pool.logs()
    outcomes = collections.Counter(
        JournalEntry.objects.using(ALIAS).filter(job_id__in=ids).values_list("outcome", flat=True)
    )
    assert outcomes == {venturi.JournalOutcome.COMPLETED: JOBS + HELD}, outcomes
    runs = collections.Counter(line.split()[0] for line in path.read_text().splitlines())
    assert len(runs) == JOBS + HELD and set(runs.values()) == {1}, "a job ran twice or never"
