"""Enqueueing: inside the caller's transaction, in bulk, delayed, and refusing bad input."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction
from django.db.models import signals
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.store import registration, waiting_workers
from tests.test_codec import full_payload
from tests.testapp.models import Account
from tests.testapp.tasks import Address, AllTypes, Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def test_enqueue_returns_the_ready_row(alias: str) -> None:
    job = Noop(n=5).enqueue(using=alias)
    stored = Job.objects.using(alias).get(pk=job.pk)
    assert (stored.kind, stored.queue, stored.state, stored.payload) == (
        "tests.noop",
        "default",
        venturi.State.READY,
        {"n": 5},
    )
    assert stored.attempt == 0 and stored.priority == venturi.Priority.NORMAL
    assert job.run_at == stored.run_at and job.enqueued_at == stored.enqueued_at


def test_a_committed_transaction_keeps_the_job_and_the_data(alias: str) -> None:
    with transaction.atomic(using=alias):
        Account.objects.using(alias).create(email="a@example.com")
        Noop(n=1).enqueue(using=alias)
    assert Account.objects.using(alias).count() == 1
    assert Job.objects.using(alias).count() == 1


def test_a_rolled_back_transaction_leaves_no_job(alias: str) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        Account.objects.using(alias).create(email="a@example.com")
        Noop(n=1).enqueue(using=alias)
        raise RuntimeError("the view failed")
    assert Account.objects.using(alias).count() == 0
    assert Job.objects.using(alias).count() == 0


def test_enqueue_on_commit_waits_for_the_commit(alias: str) -> None:
    with transaction.atomic(using=alias):
        Noop(n=1).enqueue_on_commit(using=alias)
        assert Job.objects.using(alias).count() == 0
    assert Job.objects.using(alias).count() == 1
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        Noop(n=2).enqueue_on_commit(using=alias)
        raise RuntimeError("rolled back")
    assert list(Job.objects.using(alias).values_list("payload", flat=True)) == [{"n": 1}]


def test_a_bad_payload_raises_naming_the_field_and_writes_nothing(alias: str) -> None:
    with pytest.raises(venturi.PayloadError, match=r"Noop\.n: expected int, got str"):
        Noop(n="five").enqueue(using=alias)  # type: ignore[arg-type]
    with pytest.raises(venturi.PayloadError, match=r"AllTypes\.address\.zip_code"):
        venturi.enqueue_many(
            [Noop(n=1), AllTypes(**{**full_payload().__dict__, "address": Address("x", "y")})],  # type: ignore[arg-type]
            using=alias,
        )
    with pytest.raises(venturi.PayloadError), transaction.atomic(using=alias):
        Noop(n="x").enqueue_on_commit(using=alias)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue"), transaction.atomic(using=alias):
        Noop(n=1).enqueue_on_commit(queue="bad queue", using=alias)
    assert Job.objects.using(alias).count() == 0


def test_bad_options_are_refused(alias: str) -> None:
    with pytest.raises(ValueError, match="queue 'no spaces'"):
        Noop().enqueue(queue="no spaces", using=alias)
    with pytest.raises(ValueError, match="delay or run_at"):
        Noop().enqueue(delay=timedelta(1), run_at=timezone.now(), using=alias)
    with pytest.raises(ValueError, match="timezone-aware"):
        Noop().enqueue(run_at=timezone.now().replace(tzinfo=None), using=alias)
    with pytest.raises(TypeError, match="not a task"):
        venturi.enqueue_many([object()], using=alias)
    assert Job.objects.using(alias).count() == 0


def test_enqueue_many_is_one_insert_per_batch(alias: str) -> None:
    with CaptureQueriesContext(connections[alias]) as queries, transaction.atomic(using=alias):
        jobs = venturi.enqueue_many(
            [Noop(n=i) for i in range(500)],
            priority=venturi.Priority.LOW,
            queue="bulk",
            using=alias,
        )
    inserts = [q for q in queries.captured_queries if "INSERT" in q["sql"].upper()]
    # PostgreSQL takes any batch as arrays; SQLite caps the parameters per statement.
    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    per_statement = connections[alias].ops.bulk_batch_size(fields, [None] * 500)
    expected = 1 if alias == "default" else math.ceil(500 / per_statement)
    assert len(inserts) == expected
    assert [job.payload["n"] for job in jobs] == list(range(500))
    assert len({job.pk for job in jobs}) == 500
    stored = Job.objects.using(alias).filter(queue="bulk", priority=venturi.Priority.LOW)
    assert stored.count() == 500


def refuse_inserts_of_n(alias: str, n: int) -> tuple[str, ...]:
    """A trigger that makes the database refuse inserting a `Noop(n)`; returns its DROP."""
    table = connections[alias].ops.quote_name(Job._meta.db_table)
    with connections[alias].cursor() as cursor:
        if alias == "default":
            cursor.execute(
                "CREATE FUNCTION venturi_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN IF NEW.payload->>'n' = '{n}' THEN RAISE EXCEPTION 'refused'; END IF; "
                "RETURN NEW; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER venturi_test_refuse BEFORE INSERT ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION venturi_test_refuse()"
            )
            return (
                f"DROP TRIGGER venturi_test_refuse ON {table}",
                "DROP FUNCTION venturi_test_refuse()",
            )
        cursor.execute(
            f"CREATE TRIGGER venturi_test_refuse BEFORE INSERT ON {table} "
            f"WHEN json_extract(NEW.payload, '$.n') = {n} BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        return ("DROP TRIGGER venturi_test_refuse",)


def test_enqueue_many_of_several_batches_is_all_or_nothing(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside a transaction, each batch used to commit on its own: a later failure kept them."""
    from django_venturi import enqueue

    monkeypatch.setattr(enqueue, "INSERT_BATCH_SIZE", 2)
    drops = refuse_inserts_of_n(alias, 3)  # in the second batch of [0, 1], [2, 3], [4]
    try:
        with pytest.raises(DatabaseError, match="refused"):
            venturi.enqueue_many([Noop(n=i) for i in range(5)], using=alias)
        assert Job.objects.using(alias).count() == 0
        jobs = venturi.enqueue_many([Noop(n=i) for i in (0, 1, 2, 4, 5)], using=alias)
        assert [job.payload["n"] for job in jobs] == [0, 1, 2, 4, 5]
        assert Job.objects.using(alias).count() == 5
    finally:
        with connections[alias].cursor() as cursor:
            for drop in drops:
                cursor.execute(drop)


def test_delay_and_run_at_set_when_the_job_is_due(alias: str) -> None:
    before = timezone.now()
    delayed = Noop().enqueue(delay=timedelta(hours=1), using=alias)
    at = timezone.now() + timedelta(days=2)
    scheduled = Noop().enqueue(run_at=at, using=alias)
    delayed.refresh_from_db()
    scheduled.refresh_from_db()
    # Database time and this host's clock are the same machine here: allow a few seconds.
    assert abs(delayed.run_at - (before + timedelta(hours=1))) < timedelta(seconds=5)
    assert scheduled.run_at == at


def test_priority_and_queue_default_to_the_task_and_can_be_overridden(alias: str) -> None:
    job = Noop().enqueue(priority=venturi.Priority.HIGH, queue="emails", using=alias)
    assert (job.priority, job.queue) == (venturi.Priority.HIGH, "emails")


def test_aenqueue_writes_the_job_from_async_code(alias: str) -> None:
    job = asyncio.run(Noop(n=9).aenqueue(using=alias))
    asyncio.run(sync_to_async(connections.close_all)())  # the executor thread's connection
    assert Job.objects.using(alias).get(pk=job.pk).payload == {"n": 9}


@pytest.mark.django_db(transaction=True)
def test_postgresql_notifies_after_the_commit_only() -> None:
    """With a worker waiting (store/waiting_workers.py), a NOTIFY follows each commit."""
    registration.register("default", name="waiting", queues=None, concurrency=1)
    assert waiting_workers.mark("default", "waiting", waiting=True)
    waiting_workers.forget()
    params = connections["default"].get_connection_params()
    with psycopg.connect(
        dbname=params["dbname"],
        user=params.get("user"),
        host=params.get("host"),
        port=params.get("port"),
        password=params.get("password"),
        autocommit=True,
    ) as listener:
        listener.execute("LISTEN venturi")

        def received() -> list[str]:
            return [n.payload for n in listener.notifies(timeout=0.5, stop_after=10)]

        with transaction.atomic():
            Noop().enqueue(queue="emails")
            assert received() == []  # not before the commit
        assert received() == ["emails"]
        with pytest.raises(RuntimeError), transaction.atomic():
            Noop().enqueue(queue="emails")
            raise RuntimeError
        assert received() == []  # never for a rollback
        venturi.enqueue_many([Noop(n=i) for i in range(50)], queue="bulk")
        assert received() == ["bulk"]  # one notification per transaction and queue


def test_a_changed_venturi_setting_is_read_again(alias: str) -> None:
    """Settings are cached between reads, and forgotten when Django says they changed."""
    assert Noop(n=1).enqueue(using=alias).queue == "default"
    with override_settings(VENTURI={"DEFAULT_QUEUE": "elsewhere"}):
        assert Noop(n=2).enqueue(using=alias).queue == "elsewhere"
    assert Noop(n=3).enqueue(using=alias).queue == "default"


def _fields(job: Job) -> dict[str, object]:
    return {field.attname: getattr(job, field.attname) for field in Job._meta.concrete_fields}


@pytest.mark.parametrize("listened", [False, True], ids=["built", "post_init heard"])
def test_returned_jobs_are_the_rows_as_the_orm_would_load_them(alias: str, listened: bool) -> None:
    """Unless someone listens to `post_init` for `Job`, returned jobs are assembled
    without `Model.__init__`: they must hold every field as a load would, be
    known as saved rows of `alias`, and save like loaded ones."""
    heard: list[Job] = []

    def on_init(sender: type[Job], instance: Job, **kwargs: object) -> None:
        heard.append(instance)

    if listened:
        signals.post_init.connect(on_init, sender=Job)
    try:
        jobs = venturi.enqueue_many(
            [Noop(n=1), Noop(n=2), Noop(n=4)],
            using=alias,
            delay=timedelta(seconds=5),
        )
        (single,) = venturi.enqueue_many([Noop(n=3)], using=alias)
    finally:
        signals.post_init.disconnect(on_init, sender=Job)
    assert heard == ([*jobs, single] if listened else [])
    for job in [*jobs, single]:
        assert not job._state.adding and job._state.db == alias
        assert not job.get_deferred_fields()  # else reading a field would load it
        assert _fields(job) == _fields(Job.objects.using(alias).get(pk=job.pk))
    jobs[0].last_error = "edited"
    jobs[0].save(update_fields=["last_error"])
    assert Job.objects.using(alias).get(pk=jobs[0].pk).last_error == "edited"
    assert Job.objects.using(alias).count() == 4
