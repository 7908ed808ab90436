"""PostgreSQL restarted under real workers: a private cluster, never the shared one.

Three `venturi_worker` processes drain a backlog while the server is restarted
twice (`pg_ctlcluster restart`: every connection closed, the server refusing
new ones until it is back). Nothing may be lost, no job may complete twice but
for runs whose claim was lost (and the journal says so), no worker may exit,
and the backlog must be done within a deadline: a job held by a live worker
that never runs it would keep its lease alive forever.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections
from pytest_django import DjangoDbBlocker

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from tests import clusters
from tests.cluster_workers import DATABASE, WorkerPool, cluster_database, environment
from tests.conftest import wait_until
from tests.testapp.soak_tasks import Journalled

ALIAS = "restarted"
JOBS = 2000
RESTART_AT = (500, 1100)
"""Completed jobs at which the server is restarted (the drain takes ~15 s)."""
DRAIN_DEADLINE = 60.0
"""Seconds for the rest of the backlog after the second restart (it takes ~10 s)."""


@pytest.fixture
def cluster(django_db_blocker: DjangoDbBlocker) -> Iterator[clusters.Cluster]:
    with django_db_blocker.unblock(), cluster_database("restart", ALIAS) as cluster:
        yield cluster


def count(state: str) -> int:
    return Job.objects.using(ALIAS).filter(state=state).count()


def runs_by_job(path: Path) -> dict[int, list[int]]:
    """Job id -> the attempts whose handler started, from `job attempt pid` lines."""
    ran: dict[int, list[int]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        job_id, attempt, _pid = (int(part) for part in line.split())
        ran[job_id].append(attempt)
    return ran


def stuck_report(pool: WorkerPool, path: Path) -> str:
    """What the jobs not done are doing: for the failure message."""
    ran = runs_by_job(path)
    rows = Job.objects.using(ALIAS).exclude(state=venturi.State.COMPLETED).order_by("id")
    lines = [
        f"job {row.pk}: {row.state} attempt {row.attempt} by {row.claimed_by} "
        f"lease to {row.lease_expires_at}; handler runs {ran.get(row.pk, [])}"
        for row in rows[:30]
    ]
    return "\n".join([f"{rows.count()} jobs not completed:", *lines, pool.logs()[-6000:]])


def check_the_journal(
    ids: set[int], ran: dict[int, list[int]], alias: str = ALIAS
) -> collections.Counter[str]:
    """Every job completed once, and every run is accounted for by the entry closing its
    claim: the one `completed`, a `retry` (the database went away under the handler), or
    `lease_expired` (the claim was lost; a late result of it `discarded`).

    Returns how the runs that did not complete ended.
    """
    entries: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    for job_id, attempt, outcome in (
        JournalEntry.objects.using(alias).order_by("id").values_list("job_id", "attempt", "outcome")
    ):
        entries[job_id].append((attempt, outcome))
    states = dict(Job.objects.using(alias).values_list("id", "state"))
    assert set(states) == ids
    assert not set(ran) - ids
    extra: collections.Counter[str] = collections.Counter()
    for job_id in ids:
        context = f"job {job_id}: journal {entries[job_id]}, handler runs {ran[job_id]}"
        assert states[job_id] == venturi.State.COMPLETED, context
        closing = {
            attempt: outcome for attempt, outcome in entries[job_id] if outcome != "discarded"
        }
        discarded = {attempt for attempt, outcome in entries[job_id] if outcome == "discarded"}
        # One entry closes each claim, attempts 1..n, the last one completed.
        assert len(closing) == len(entries[job_id]) - len(discarded), context
        assert sorted(closing) == list(range(1, len(closing) + 1)), context
        assert list(closing.values()).count("completed") == 1, context
        assert closing[len(closing)] == "completed", context
        assert set(closing.values()) <= {"completed", "retry", "lease_expired"}, context
        # Only a lost claim's late result is discarded.
        assert all(closing.get(attempt) == "lease_expired" for attempt in discarded), context
        # Each claim ran its handler at most once; every run belongs to a claim.
        assert len(ran[job_id]) == len(set(ran[job_id])), context
        assert set(ran[job_id]) <= set(closing), context
        assert len(closing) in ran[job_id], context  # the completion is a run's
        extra.update(closing[attempt] for attempt in ran[job_id] if attempt != len(closing))
    return extra


def test_three_workers_drain_a_backlog_through_two_postgresql_restarts(
    cluster: clusters.Cluster, tmp_path: Path
) -> None:
    path = tmp_path / "runs.log"
    jobs = venturi.enqueue_many([Journalled(path=str(path), sleep=0.05)] * JOBS, using=ALIAS)
    ids = {job.pk for job in jobs}
    pool = WorkerPool(tmp_path, environment(cluster.url(DATABASE)), "--concurrency", "4")
    pool.start(3)
    try:
        for threshold in RESTART_AT:
            wait_until(
                lambda threshold=threshold: count(venturi.State.COMPLETED) >= threshold,
                timeout=60,
                message=f"{threshold} jobs completed",
            )
            assert count(venturi.State.COMPLETED) < JOBS - 300, "too little left to restart"
            cluster.restart()
            connections[ALIAS].close()  # this process's connection died with the server
            assert not pool.exited(), pool.logs()
        try:
            wait_until(
                lambda: count(venturi.State.COMPLETED) == JOBS,
                timeout=DRAIN_DEADLINE,
                message="every job to complete",
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{stuck_report(pool, path)}") from None
        assert not pool.exited(), pool.logs()
        codes = pool.stop()
    finally:
        pool.kill_all()
    assert codes == [0, 0, 0], pool.logs()
    extra = check_the_journal(ids, runs_by_job(path))
    logs = pool.logs()
    print(
        f"\nrestarts: {JOBS} jobs, 3 workers, 2 restarts: all completed once; runs that did "
        f"not complete: {dict(extra)}; 'lost the database' logged "
        f"{logs.count('lost the database')} times"
    )
