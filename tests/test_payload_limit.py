"""`VENTURI["MAX_PAYLOAD_BYTES"]`: a payload, carry or result over it is refused.

Sizes are bytes of compact JSON in UTF-8. At enqueue the refusal is a
`PayloadTooLarge` (a `PayloadError`) naming the size and the limit, and nothing
is written; in a worker, a carry or result over the limit fails its job with a
journal entry that says so, and the worker goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_venturi as venturi
from django_venturi import enqueue
from django_venturi.checks import check_periodic, check_settings
from django_venturi.models import Job, JournalEntry
from django_venturi.payloads.size import PayloadTooLarge, encoded_size
from django_venturi.worker.scheduler import Scheduler
from tests.conftest import Workers
from tests.test_enqueue import refuse_inserts_of_n
from tests.test_periodic import seen_long_ago
from tests.test_text import installed_tasks_module
from tests.testapp.limit_tasks import BLOB_OVERHEAD, Blob, Checkpoints, KeyedBlob, Returns
from tests.testapp.tasks import Noop

LIMIT = 100
"""The limit most tests set: small, so each payload is quick to build."""


@pytest.fixture
def limit(settings: Any) -> int:
    """`MAX_PAYLOAD_BYTES` set to LIMIT in this process."""
    settings.VENTURI = {**settings.VENTURI, "MAX_PAYLOAD_BYTES": LIMIT}
    return LIMIT


def text_of_bytes(size: int, char: str = "x") -> str:
    """Text whose UTF-8 is exactly `size` bytes, as many `char` as fit, padded with 'a'."""
    width = len(char.encode())
    return char * (size // width) + "a" * (size % width)


def blob_of(size: int, char: str = "x") -> Blob:
    """A `Blob` whose payload is exactly `size` bytes of JSON."""
    blob = Blob(text=text_of_bytes(size - BLOB_OVERHEAD, char))
    assert encoded_size({"text": blob.text}) == size
    return blob


def jobs(alias: str) -> int:
    return Job.objects.using(alias).count()


# ------------------------------------------------------------ at enqueue


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_the_default_limit_is_a_million_bytes_and_the_error_names_size_and_limit(
    alias: str,
) -> None:
    at_the_limit = blob_of(1_000_000).enqueue(using=alias)
    with pytest.raises(venturi.PayloadError) as raised:
        blob_of(1_000_001).enqueue(using=alias)
    assert str(raised.value) == (
        "Blob: is 1,000,001 bytes as JSON, over the limit of 1,000,000 bytes "
        "(VENTURI['MAX_PAYLOAD_BYTES'])"
    )
    assert isinstance(raised.value, PayloadTooLarge)
    assert (raised.value.size, raised.value.limit) == (1_000_001, 1_000_000)
    assert list(Job.objects.using(alias).values_list("pk", flat=True)) == [at_the_limit.pk]


@pytest.mark.django_db(databases=["default", "sqlite"])
@pytest.mark.parametrize("char", ["é", "\U0001f600", "中"], ids=["2-byte", "4-byte", "3-byte"])
def test_multibyte_text_counts_in_utf8_bytes_not_characters_or_escapes(
    alias: str, limit: int, char: str
) -> None:
    under = blob_of(limit, char)
    # Far fewer characters than the limit, and far more bytes once escaped as \\uXXXX.
    assert len(under.text) < limit - BLOB_OVERHEAD < len(json.dumps(under.text))
    job = under.enqueue(using=alias)
    assert Job.objects.using(alias).get(pk=job.pk).payload == {"text": under.text}
    with pytest.raises(PayloadTooLarge, match=rf"is {limit + 1} bytes as JSON.* of {limit} bytes"):
        Blob(text=under.text + "a").enqueue(using=alias)
    assert jobs(alias) == 1


def chain_of(task: Blob, alias: str) -> object:
    return venturi.chain(Noop(n=1), task).enqueue(using=alias)


def group_with_member(task: Blob, alias: str) -> object:
    return venturi.group([Noop(n=1), task], then=Noop(n=2)).enqueue(using=alias)


def group_with_callback(task: Blob, alias: str) -> object:
    return venturi.group([Noop(n=1)], then=task).enqueue(using=alias)


def after_another(task: Blob, alias: str) -> object:
    with transaction.atomic(using=alias):
        first = Noop(n=1).enqueue(using=alias)
        return task.enqueue(using=alias, after=[first])


def on_commit(task: Blob, alias: str) -> object:
    with transaction.atomic(using=alias):
        task.enqueue_on_commit(using=alias)
    return None


def asynchronously(task: Blob, alias: str) -> object:
    try:
        return asyncio.run(task.aenqueue(using=alias))
    finally:
        asyncio.run(sync_to_async(connections.close_all)())  # the executor thread's connection


ENQUEUE_PATHS: dict[str, Callable[[Blob, str], object]] = {
    "enqueue": lambda task, alias: task.enqueue(using=alias),
    "enqueue_on_commit": on_commit,
    "aenqueue": asynchronously,
    "enqueue_many": lambda task, alias: venturi.enqueue_many([task], using=alias),
    "enqueue_after": after_another,
    "chain": chain_of,
    "group_member": group_with_member,
    "group_callback": group_with_callback,
}


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.parametrize("path", sorted(ENQUEUE_PATHS))
def test_every_enqueue_path_takes_a_payload_at_the_limit_and_refuses_one_byte_more(
    alias: str, limit: int, path: str
) -> None:
    enqueue = ENQUEUE_PATHS[path]
    enqueue(blob_of(limit), alias)
    written = jobs(alias)
    assert Job.objects.using(alias).filter(kind="tests.limit.blob").count() == 1
    with pytest.raises(PayloadTooLarge, match=rf"Blob.*is {limit + 1} bytes.* of {limit} bytes"):
        enqueue(blob_of(limit + 1), alias)
    assert jobs(alias) == written  # nothing of the refused call: no job, no workflow step


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_bulk_with_one_payload_over_the_limit_writes_none_and_names_the_item(
    alias: str, limit: int
) -> None:
    batch = [blob_of(limit), blob_of(20), blob_of(limit + 5), blob_of(limit)]
    with pytest.raises(PayloadTooLarge) as raised:
        venturi.enqueue_many(batch, using=alias)
    assert str(raised.value).startswith(f"Blob (item 2 of 4): is {limit + 5} bytes as JSON")
    assert jobs(alias) == 0
    assert len(venturi.enqueue_many([blob_of(limit)] * 3, using=alias)) == 3


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_bulk_is_cut_into_statements_by_payload_bytes_all_or_nothing(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One statement per batch is one jsonb document, which PostgreSQL caps at 255 MB."""
    monkeypatch.setattr(enqueue, "INSERT_BATCH_BYTES", 250)  # two 100-byte payloads each
    blobs = [blob_of(100, char) for char in "abcdefg"]
    with CaptureQueriesContext(connections[alias]) as queries:
        written = venturi.enqueue_many(blobs, using=alias)
    assert sum("INSERT INTO" in query["sql"] for query in queries) == 4
    stored = Job.objects.using(alias).order_by("id")
    assert [job.pk for job in stored] == [job.pk for job in written]
    assert [job.payload["text"] for job in stored] == [blob.text for blob in blobs]
    # The statements are one transaction: the database refusing the last takes them all.
    monkeypatch.setattr(enqueue, "INSERT_BATCH_BYTES", 10)  # {"n":0} is 7 bytes: one each
    drops = refuse_inserts_of_n(alias, 3)
    try:
        with pytest.raises(DatabaseError, match="refused"):
            venturi.enqueue_many([Noop(n=n) for n in range(4)], using=alias)
    finally:
        with connections[alias].cursor() as cursor:
            for drop in drops:
                cursor.execute(drop)
    assert Job.objects.using(alias).count() == 7


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_none_means_no_limit(alias: str, settings: Any) -> None:
    settings.VENTURI = {**settings.VENTURI, "MAX_PAYLOAD_BYTES": None}
    job = blob_of(3_000_000).enqueue(using=alias)
    assert len(Job.objects.using(alias).get(pk=job.pk).payload["text"]) == 3_000_000 - 11


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_merge_that_grows_the_payload_past_the_limit_is_refused(alias: str, limit: int) -> None:
    room = limit - len('{"key":"k","text":""}')
    first = KeyedBlob(key="k", text="x" * (room - 10)).enqueue(using=alias)
    KeyedBlob(key="k", text="y" * 10).enqueue(using=alias)  # merged: exactly the limit
    with pytest.raises(
        PayloadTooLarge, match=rf"KeyedBlob\.merge\(\)'s payload: is {limit + 1} bytes"
    ):
        KeyedBlob(key="k", text="z").enqueue(using=alias)
    stored = Job.objects.using(alias).get()
    assert stored.pk == first.pk and stored.payload["text"] == "x" * (room - 10) + "y" * 10


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_the_django_tasks_backend_refuses_arguments_over_the_limit(
    alias: str, settings: Any
) -> None:
    tasks = installed_tasks_module()
    backend = "default" if alias == "default" else "sqlite"
    settings.VENTURI = {**settings.VENTURI, "MAX_PAYLOAD_BYTES": 1000}  # the options take 200
    tasks.echo.using(backend=backend).enqueue("x" * 500)
    with pytest.raises(PayloadTooLarge, match=r"\.echo\(\.\.\.\): is 1,\d{3} bytes.* of 1,000 "):
        tasks.echo.using(backend=backend).enqueue("x" * 1000)
    assert jobs(alias) == 1


# ------------------------------------------------------------ periodic ticks


BIG_SCHEDULE = {"task": "tests.limit.blob", "cron": "* * * * *", "payload": {"text": "x" * LIMIT}}


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_a_periodic_payload_over_the_limit_is_named_by_the_check_and_its_ticks_enqueue_nothing(
    alias: str, limit: int, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    small = {"task": "tests.noop", "cron": "* * * * *", "payload": {"n": 1}}
    settings.VENTURI = {**settings.VENTURI, "PERIODIC": [small, BIG_SCHEDULE]}
    (problem,) = check_periodic()
    assert problem.id == "venturi.E044"
    assert "VENTURI['PERIODIC'][1]: Blob: is 111 bytes as JSON, over the limit of 100" in str(
        problem.msg
    )
    for kind in ("tests.noop", "tests.limit.blob"):  # seen before: their latest ticks run
        seen_long_ago(alias, kind)
    with caplog.at_level(logging.ERROR, logger="django_venturi.periodic"):
        created = Scheduler(alias).run_pass()
    # The small schedule still runs; the large one logs an error and writes nothing.
    assert [job.kind for job in Job.objects.using(alias).filter(pk__in=created)] == ["tests.noop"]
    assert jobs(alias) == 1
    assert "Blob: is 111 bytes as JSON" in caplog.text


# ------------------------------------------------------------ the system check


@pytest.mark.parametrize("value", [None, 1, 1_000_000, 268_435_455])
def test_the_check_accepts_none_or_a_whole_number_of_bytes_jsonb_can_hold(value: object) -> None:
    with override_settings(VENTURI={"MAX_PAYLOAD_BYTES": value}):
        assert check_settings() == []


@pytest.mark.parametrize("value", [0, -1, 1.5, "1MB", True, 268_435_456, 10**30], ids=repr)
def test_the_check_names_a_bad_limit(value: object) -> None:
    with override_settings(VENTURI={"MAX_PAYLOAD_BYTES": value}):
        (error,) = check_settings()
    assert error.id == "venturi.E014"
    assert error.msg.startswith("VENTURI['MAX_PAYLOAD_BYTES'] must be None (no limit) or a whole")
    assert error.msg.endswith(f"got {value!r}")


# ------------------------------------------------------------ carry and result, in a worker


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_a_worker_fails_a_job_whose_carry_or_result_is_over_the_limit_and_goes_on(
    alias: str, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's limit; jobs are enqueued under this process's (the default).
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps({"MAX_PAYLOAD_BYTES": 1000}))
    carry_over = Checkpoints(size=999).enqueue(using=alias)  # "ccc...": 1001 bytes
    carry_at = Checkpoints(size=998).enqueue(using=alias)
    result_over = Returns(size=999).enqueue(using=alias)
    result_at = Returns(size=998).enqueue(using=alias)
    tasks = installed_tasks_module()  # skips the test where no Tasks framework is installed
    backend = "default" if alias == "default" else "sqlite"
    tasks_result_over = tasks.echo.using(backend=backend).enqueue("e" * 1000)  # 1025 bytes back

    workers.burst(alias, timeout=120)

    def finished(job: Job) -> tuple[str, str]:
        job.refresh_from_db()
        entry = JournalEntry.objects.using(alias).filter(job_id=job.pk).latest("id")
        return job.state, f"{entry.error_type}: {entry.error_message}"

    assert finished(carry_at)[0] == venturi.State.COMPLETED
    assert finished(result_at)[0] == venturi.State.COMPLETED
    state, reason = finished(carry_over)
    assert state == venturi.State.FAILED
    assert reason == (
        "django_venturi.payloads.size.PayloadTooLarge: Checkpoints.carry: is 1,001 bytes "
        "as JSON, over the limit of 1,000 bytes (VENTURI['MAX_PAYLOAD_BYTES'])"
    )
    assert Job.objects.using(alias).get(pk=carry_over.pk).carry is None
    state, reason = finished(result_over)
    assert state == venturi.State.FAILED
    assert reason.startswith("django_venturi.payloads.size.PayloadTooLarge: result: is 1,001")
    assert Job.objects.using(alias).get(pk=result_over.pk).result is None
    state, reason = finished(Job.objects.using(alias).get(pk=int(tasks_result_over.id)))
    assert state == venturi.State.FAILED
    assert reason.endswith(
        "the return value: is 1,025 bytes as JSON, over the limit of 1,000 "
        "bytes (VENTURI['MAX_PAYLOAD_BYTES'])"
    )
