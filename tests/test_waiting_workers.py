"""Wake-ups without the commit lock: an enqueue NOTIFYs after its commit, and only while
a worker of its queue waits (`store/waiting_workers.py`), on PostgreSQL with real
worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job, WorkerProcess
from django_venturi.store import registration, waiting_workers
from tests.conftest import Workers, wait_until
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


@pytest.fixture
def listener() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    params = connections["default"].get_connection_params()
    with psycopg.connect(
        dbname=params["dbname"],
        user=params.get("user"),
        host=params.get("host"),
        port=params.get("port"),
        password=params.get("password"),
        autocommit=True,
    ) as connection:
        connection.execute("LISTEN venturi")
        yield connection


@pytest.fixture(autouse=True)
def forgetting() -> None:
    """Each test starts without the process's memory of looks that found nobody."""
    waiting_workers.forget()


def received(listener: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    return sorted(n.payload for n in listener.notifies(timeout=0.3, stop_after=10))


def waiting_worker(name: str, queues: list[str] | None) -> None:
    registration.register("default", name=name, queues=queues, concurrency=1)
    assert waiting_workers.mark("default", name, waiting=True)


def test_no_notification_while_no_worker_waits(
    listener: psycopg.Connection[tuple[object, ...]],
) -> None:
    registration.register("default", name="busy", queues=None, concurrency=1)
    tasks.Noop(n=1).enqueue()
    venturi.enqueue_many([tasks.Noop(n=2)], queue="emails")
    assert received(listener) == []


def test_a_notification_for_each_queue_a_live_waiting_worker_serves(
    listener: psycopg.Connection[tuple[object, ...]],
) -> None:
    waiting_worker("emails", ["emails"])
    waiting_worker("stopped", ["reports"])
    registration.stopped("default", name="stopped", processed=0)
    waiting_worker("silent", ["exports"])
    silent_since = timezone.now() - registration.stale_after() - timedelta(seconds=1)
    WorkerProcess.objects.filter(name="silent").update(heartbeat_at=silent_since)
    for queue in ("emails", "reports", "exports", "other"):
        tasks.Noop().enqueue(queue=queue)
    assert received(listener) == ["emails"]
    waiting_worker("every", None)
    venturi.enqueue_many([tasks.Noop(n=n) for n in range(3)], queue="other")
    assert received(listener) == ["other"]


def test_a_look_that_found_nobody_is_remembered_for_a_moment(
    listener: psycopg.Connection[tuple[object, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting_workers, "NOT_WAITING_MEMORY", 3600.0)
    tasks.Noop(n=1).enqueue(queue="emails")  # looks: nobody waits
    waiting_worker("emails", ["emails"])
    with CaptureQueriesContext(connections["default"]) as queries:
        tasks.Noop(n=2).enqueue(queue="emails")
    assert not any("pg_notify" in query["sql"] for query in queries.captured_queries)
    assert received(listener) == []  # the worker finds it at its claim after the mark
    waiting_workers.forget()
    tasks.Noop(n=3).enqueue(queue="emails")
    assert received(listener) == ["emails"]


def test_the_memory_is_read_at_the_commit_not_at_the_enqueue(
    listener: psycopg.Connection[tuple[object, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting_workers, "NOT_WAITING_MEMORY", 3600.0)
    tasks.Noop(n=1).enqueue(queue="emails")  # looks: nobody waits
    waiting_worker("emails", ["emails"])
    with transaction.atomic():
        tasks.Noop(n=2).enqueue(queue="emails")
        waiting_workers.forget()  # the memory ran out before the commit
    assert received(listener) == ["emails"]


def test_a_stopped_worker_is_not_waiting_any_more() -> None:
    waiting_worker("leaving", None)
    registration.stopped("default", name="leaving", processed=0)
    assert not WorkerProcess.objects.get(name="leaving").waiting
    registration.register("default", name="leaving", queues=None, concurrency=1)
    assert not WorkerProcess.objects.get(name="leaving").waiting  # a restart starts afresh


def test_without_notify_the_enqueue_only_writes(alias: str) -> None:
    """On SQLite there is nothing to wake (workers poll): the enqueue is the INSERT alone."""
    job = tasks.Noop(n=3).enqueue(using=alias)
    assert Job.objects.using(alias).get(pk=job.pk).state == venturi.State.READY


def is_waiting(workers_alive: int = 1) -> bool:
    rows = WorkerProcess.objects.filter(stopped_at__isnull=True)
    return rows.count() == workers_alive and all(row.waiting for row in rows)


def test_an_idle_worker_wakes_for_a_job_from_another_process_before_its_poll(
    workers: Workers,
) -> None:
    workers.start("default", "--poll-interval", "60")
    wait_until(is_waiting, message="the idle worker to mark itself waiting")
    for n in range(3):
        job = tasks.Noop(n=n).enqueue()
        # Far within the poll interval: only the NOTIFY after the commit wakes it.
        wait_until(
            lambda job=job: Record.objects.filter(job_id=job.pk).exists(),
            timeout=15,
            message=f"job {n} to run on the NOTIFY",
        )


def test_a_worker_behind_clears_its_mark_and_sets_it_again_once_drained(
    workers: Workers,
) -> None:
    workers.start("default", "--poll-interval", "60", "--concurrency", "1", "--batch-size", "1")
    wait_until(is_waiting, message="the idle worker to mark itself waiting")
    jobs = venturi.enqueue_many([tasks.Sleeper(seconds=0.3) for _ in range(6)])
    # Its claims of one job come back full: it is behind, and enqueues need not wake it.
    wait_until(lambda: not is_waiting(), message="the busy worker to clear its mark")
    wait_until(
        lambda: (
            Job.objects.filter(pk__in=[job.pk for job in jobs], state="completed").count()
            == len(jobs)
        ),
        message="the jobs to complete",
    )
    wait_until(is_waiting, message="the drained worker to mark itself waiting again")
    job = tasks.Noop(n=9).enqueue()
    wait_until(
        lambda: Record.objects.filter(job_id=job.pk).exists(),
        timeout=15,
        message="a job after the drain to run on the NOTIFY",
    )
