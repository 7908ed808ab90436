"""Error triage in the admin: the stored error type, filters, readable errors, error groups,
and retry all / cancel all in this filter, with and without their permissions."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import django_venturi as venturi
from django_venturi.admin import bulk_actions
from django_venturi.admin.display import cut_between_words, error_cell
from django_venturi.admin.error_groups import error_groups
from django_venturi.admin.filters import (
    CURRENT_ERROR_SQL,
    ERROR_TYPES_SQL,
    ErrorTypeFilter,
    error_types,
)
from django_venturi.models import Job, JournalEntry
from django_venturi.store.bulk_actions import retry_all
from django_venturi.store.error_types import error_type_of
from tests.conftest import Workers, wait_until
from tests.query_plans import most_rows_read_by_one_node
from tests.test_admin import finished, staff
from tests.testapp import tasks
from tests.testapp.control_tasks import Cancellable
from tests.testapp.models import Record

error_type_migration = importlib.import_module("django_venturi.migrations.0017_error_type")

CHANGELIST = reverse("admin:django_venturi_job_changelist")
JOURNAL = reverse("admin:django_venturi_journalentry_changelist")
RETRY_ALL = reverse("admin:django_venturi_job_retry_all")
CANCEL_ALL = reverse("admin:django_venturi_job_cancel_all")


def listed(client: Client, url: str, **query: str) -> set[int]:
    response = client.get(f"{url}?{urlencode(query)}")
    assert response.status_code == 200
    return {row.pk for row in response.context["cl"].result_list}


def failed_with(error_type: str, message: str, **fields: Any) -> Job:
    return finished(
        "failed", last_error=f"{error_type}: {message}", error_type=error_type, **fields
    )


# ---------------------------------------------------------------- the stored type


@pytest.mark.parametrize(
    ("last_error", "expected"),
    [
        ("ValueError: bad input", "ValueError"),
        ("shop.errors.PaymentDeclined: card refused\nTraceback ...", "shop.errors.PaymentDeclined"),
        ("builtins.KeyError: 'x'", "builtins.KeyError"),
        ("merged into job #3 when it went back to ready", ""),
        ("no colon at all", ""),
        ("", ""),
    ],
)
def test_the_error_type_of_an_old_last_error(last_error: str, expected: str) -> None:
    assert error_type_of(last_error) == expected


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_a_verdict_stores_the_error_type_beside_the_last_error(alias: str) -> None:
    """PostgreSQL writes verdicts in one statement, SQLite through the ORM: both store it."""
    failing = tasks.Permanent().enqueue(using=alias)
    retrying = tasks.AlwaysFails().enqueue(using=alias)
    done = tasks.Noop(n=1).enqueue(using=alias)
    venturi.testing.drain(using=alias)  # AlwaysFails runs three times, then gives up
    rows = {job.pk: job for job in Job.objects.using(alias)}
    assert rows[failing.pk].error_type == "django_venturi.outcomes.TaskError"
    assert rows[retrying.pk].error_type == "builtins.ValueError"
    assert rows[retrying.pk].last_error.startswith("builtins.ValueError: gave up after 3")
    assert rows[done.pk].error_type == ""


# ---------------------------------------------------------------- filters


@pytest.mark.django_db
def test_the_job_list_filters_by_error_type_kind_queue_state_and_dates(
    admin_client: Client,
) -> None:
    value = failed_with("builtins.ValueError", "bad", kind="tests.noop")
    key = failed_with("builtins.KeyError", "'sku'", kind="tests.noop", queue="bulk")
    recovered = finished("completed", last_error="builtins.ValueError: a blip")
    Job.objects.filter(pk=recovered.pk).update(error_type="builtins.ValueError")
    old = failed_with("builtins.ValueError", "long ago", age=timedelta(days=40))
    Job.objects.filter(pk=old.pk).update(enqueued_at=timezone.now() - timedelta(days=40))

    # The type filter shows current errors only, as the error column does.
    assert listed(admin_client, CHANGELIST, error_type="builtins.ValueError") == {value.pk, old.pk}
    assert listed(admin_client, CHANGELIST, error_type="builtins.KeyError", queue="bulk") == {
        key.pk
    }
    assert (
        listed(admin_client, CHANGELIST, error_type="builtins.KeyError", queue="default") == set()
    )
    assert listed(admin_client, CHANGELIST, state="completed", kind="tests.noop") == {recovered.pk}
    week_ago = (timezone.now() - timedelta(days=7)).isoformat()
    assert old.pk not in listed(admin_client, CHANGELIST, enqueued_at__gte=week_ago)
    assert value.pk in listed(admin_client, CHANGELIST, enqueued_at__gte=week_ago)
    assert listed(admin_client, CHANGELIST, finished_at__lt=week_ago) == {old.pk}
    # Both types are offered, by their short names.
    page = admin_client.get(CHANGELIST).content.decode()
    assert "?error_type=builtins.KeyError" in page and ">KeyError</a>" in page
    assert error_types() == ["builtins.KeyError", "builtins.ValueError"]


@pytest.mark.django_db
def test_the_journal_filters_by_kind_error_type_and_finish(admin_client: Client) -> None:
    noop = tasks.Noop(n=1).enqueue()
    other = tasks.AlwaysFails().enqueue()
    entries = [
        JournalEntry.objects.create(job=noop, attempt=1, outcome="completed"),
        JournalEntry.objects.create(
            job=other, attempt=1, outcome="retry", error_type="builtins.ValueError"
        ),
    ]
    Job.objects.filter(pk=other.pk).update(error_type="builtins.ValueError")
    assert listed(admin_client, JOURNAL, kind="tests.noop") == {entries[0].pk}
    assert listed(admin_client, JOURNAL, error_type="builtins.ValueError") == {entries[1].pk}
    tomorrow = (timezone.now() + timedelta(days=1)).isoformat()
    assert listed(admin_client, JOURNAL, finished_at__gte=tomorrow) == set()


# ---------------------------------------------------------------- readable errors


def test_an_error_is_cut_between_words_with_the_whole_text_unfolding() -> None:
    message = "ConnectionError: " + " ".join(f"word{n}" for n in range(60))
    shown = cut_between_words(message)
    assert shown.endswith("…") and len(shown) <= 161
    assert message.startswith(shown[:-1]) and message[len(shown) - 1] == " "
    cell = error_cell(message, message + "\nTraceback (most recent call last): ...")
    assert "<details" in cell and "Traceback (most recent call last)" in cell
    assert error_cell("ValueError: short", "ValueError: short").startswith("<span")


@pytest.mark.django_db
def test_the_error_column_shows_type_and_message_without_cutting_words(
    admin_client: Client,
) -> None:
    long_message = "the payment provider answered 503 " * 10
    failed_with("shop.errors.PaymentDeclined", long_message.strip())
    page = admin_client.get(CHANGELIST).content.decode()
    assert "<summary>PaymentDeclined: the payment provider answered 503 the payment" in page
    assert "answered 503 the…</summary>" in page  # cut after a whole word


# ---------------------------------------------------------------- error groups


@pytest.mark.django_db
def test_errors_group_by_type_and_first_line_with_counts_and_links(admin_client: Client) -> None:
    for _ in range(3):
        failed_with("builtins.ValueError", "bad sku\nmore detail")
    failed_with("builtins.ValueError", "bad price")
    failed_with("builtins.KeyError", "'sku'", kind="tests.other")
    finished("completed", last_error="builtins.ValueError: bad sku", error_type="x.Old")
    groups = error_groups()
    assert [(g.name, g.first_line, g.count) for g in groups] == [
        ("ValueError", "bad sku", 3),
        ("KeyError", "'sku'", 1),
        ("ValueError", "bad price", 1),
    ]
    assert groups[0].url == f"{CHANGELIST}?error_type=builtins.ValueError"
    of_kind = error_groups("tests.other")
    assert [(g.name, g.count) for g in of_kind] == [("KeyError", 1)]
    assert of_kind[0].url.endswith("error_type=builtins.KeyError&kind=tests.other")
    page = admin_client.get(f"{CHANGELIST}?has_error=yes").content.decode()
    assert "Current errors by type" in page and "bad sku" in page
    assert "Current errors by type" not in admin_client.get(CHANGELIST).content.decode()


# ---------------------------------------------------------------- retry all, cancel all


@pytest.mark.django_db
@pytest.mark.parametrize("url", [RETRY_ALL, CANCEL_ALL])
def test_the_bulk_actions_need_their_permission_by_get_and_post(url: str) -> None:
    failed = failed_with("builtins.ValueError", "bad")
    ready = tasks.Noop(n=1).enqueue()
    viewer = staff()
    assert viewer.get(url).status_code == 403
    assert viewer.post(url, {"post": "yes"}).status_code == 403
    assert "in this filter" not in viewer.get(CHANGELIST).content.decode()
    wrong = staff("cancel_job" if url == RETRY_ALL else "retry_job")
    assert wrong.get(url).status_code == 403
    assert wrong.post(url, {"post": "yes"}).status_code == 403
    assert Job.objects.get(pk=failed.pk).state == "failed"
    assert Job.objects.get(pk=ready.pk).state == "ready"
    assert not LogEntry.objects.exists()


@pytest.mark.django_db
def test_retry_all_in_a_filter_asks_then_retries_every_page_in_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bulk_actions, "BATCH_SIZE", 300)
    Job.objects.bulk_create(
        Job(
            kind="tests.noop",
            payload={"n": n},
            state="failed",
            attempt=1,
            failures=1,
            finished_at=timezone.now(),
            last_error="builtins.ValueError: bad",
            error_type="builtins.ValueError",
        )
        for n in range(2_000)
    )
    other = failed_with("builtins.KeyError", "'sku'")
    retrier = staff("retry_job")
    query = "?error_type=builtins.ValueError"
    assert "Retry all in this filter" in retrier.get(f"{CHANGELIST}{query}").content.decode()
    asking = retrier.get(f"{RETRY_ALL}{query}")
    assert "holds 2000 jobs; the newest 20 are listed" in asking.content.decode()
    assert Job.objects.filter(state="failed").count() == 2_001
    done = retrier.post(f"{RETRY_ALL}{query}", {"post": "yes"}, follow=True)
    said = [str(message) for message in done.context["messages"]]
    assert said[0].startswith("2000 jobs will run now. (7 batches,")
    assert Job.objects.filter(state="ready", failures=0).count() == 2_000
    assert Job.objects.get(pk=other.pk).state == "failed"
    entry = LogEntry.objects.get()
    assert entry.user_id == int(retrier.session["_auth_user_id"])
    assert entry.object_repr == "Retry all in this filter: error_type=builtins.ValueError"
    assert entry.change_message == "2000 jobs will run now."


@pytest.mark.django_db(transaction=True)
def test_cancel_all_in_a_filter_cancels_ready_jobs_and_stops_a_running_one(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk_actions, "BATCH_SIZE", 500)
    running = Cancellable().enqueue()
    workers.start("default", "--queues", "default")
    wait_until(
        lambda: Record.objects.filter(job_id=running.pk, kind="cancellable_started").exists(),
        message="the job to start",
    )
    Job.objects.bulk_create(
        Job(
            kind="tests.cancellable",
            payload={"seconds": 60},
            run_at=timezone.now() + timedelta(hours=1),
        )
        for _ in range(2_500)
    )
    cancelled = Job.objects.filter(kind="tests.cancellable", state="cancelled")
    untouched = tasks.Noop(n=1).enqueue(queue="elsewhere")  # no worker serves it
    canceller = staff("cancel_job")
    done = canceller.post(f"{CANCEL_ALL}?kind=tests.cancellable", {"post": "yes"}, follow=True)
    said = [str(message) for message in done.context["messages"]]
    assert said[0].startswith("2500 jobs cancelled; 1 job running asked to stop. (6 batches,")
    wait_until(lambda: Job.objects.get(pk=running.pk).state == "cancelled", timeout=30)
    assert cancelled.count() == 2_501
    assert Job.objects.get(pk=untouched.pk).state == "ready"
    assert "learnt by notification" in workers.log()


@pytest.mark.django_db
def test_a_filter_the_list_cannot_use_stops_the_bulk_actions(admin_client: Client) -> None:
    """An unusable filter would otherwise select every job: nothing is done, a message says so."""
    ready = tasks.Noop(n=1).enqueue()
    response = admin_client.post(f"{CANCEL_ALL}?attempt=x", {"post": "yes"}, follow=True)
    said = [str(message) for message in response.context["messages"]]
    assert "Cancel all in this filter: the filter cannot be used; nothing was done." in said
    assert Job.objects.get(pk=ready.pk).state == "ready"


@pytest.mark.django_db
def test_a_bulk_action_out_of_time_says_so_and_the_next_press_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bulk_actions, "BATCH_SIZE", 100)
    monkeypatch.setattr(bulk_actions, "TIME_BUDGET", 0.0)  # one batch per request
    Job.objects.bulk_create(Job(kind="tests.noop", payload={"n": n}) for n in range(250))
    canceller = staff("cancel_job")
    said = []
    for _ in range(3):
        done = canceller.post(f"{CANCEL_ALL}?kind=tests.noop", {"post": "yes"}, follow=True)
        said.append(str(next(iter(done.context["messages"]))))
        cancelled = Job.objects.filter(state="cancelled").count()
        assert cancelled == min(100 * len(said), 250)
    assert said[0].startswith("100 jobs cancelled; 0 jobs running asked to stop. Stopped after")
    assert said[2].startswith("50 jobs cancelled; 0 jobs running asked to stop. (1 batch,")
    with pytest.raises(ValueError, match="batch_size: expected a positive number of jobs"):
        retry_all(Job.objects.all(), batch_size=0)
    with pytest.raises(ValueError, match="time_budget: expected seconds"):
        retry_all(Job.objects.all(), time_budget=-1)


# ---------------------------------------------------------------- plans on a large table


def explained(sql: str, params: Any) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_error_types_and_their_filter_read_the_index_not_the_table() -> None:
    """50,000 finished jobs beside a few failed ones, not analysed: the list of types
    and the filter by a rare type read a handful of index entries, never the table."""
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {table} (kind, queue, priority, state, payload, attempt, failures,
                                     run_at, enqueued_at, finished_at, claimed_by, last_error,
                                     error_type)
                SELECT 'tests.noop', 'default', 1, 'completed', '{{"n": 0}}', 1, 0,
                       now(), now(), now(), '', '', '' FROM generate_series(1, 50000) AS i"""
        )
    for error_type in ("a.Rare", "b.Other", "c.Third"):
        failed_with(error_type, "broken")
    sql = ERROR_TYPES_SQL.format(job=table, current=CURRENT_ERROR_SQL)
    assert most_rows_read_by_one_node(explained(sql, [100])) <= 10
    rare = ErrorTypeFilter(None, {"error_type": ["a.Rare"]}, Job, None)
    queryset = rare.queryset(None, Job.objects.order_by("-id"))[:50]  # as the list pages it
    plan = explained(*queryset.query.sql_with_params())
    assert "venturi_job_error_type_idx" in json.dumps(plan)
    assert most_rows_read_by_one_node(plan) <= 10
    assert error_types() == ["a.Rare", "b.Other", "c.Third"]


@pytest.mark.django_db
def test_a_type_no_job_has_now_filters_to_nothing_and_cancel_all_does_nothing(
    admin_client: Client,
) -> None:
    """Django drops a filter that offers no choice: the selected type is always offered."""
    ready = tasks.Noop(n=1).enqueue()
    assert listed(admin_client, CHANGELIST, error_type="gone.Error") == set()
    admin_client.post(f"{CANCEL_ALL}?error_type=gone.Error", {"post": "yes"})
    assert Job.objects.get(pk=ready.pk).state == "ready"


@pytest.mark.django_db
@pytest.mark.parametrize("parameter", ["kind", "queue"])
def test_a_kind_or_queue_no_task_names_still_filters(admin_client: Client, parameter: str) -> None:
    tasks.Noop(n=1).enqueue()
    assert listed(admin_client, CHANGELIST, **{parameter: "nobody.registers.this"}) == set()


@pytest.fixture
def restores_schema(alias: str) -> Iterator[None]:
    yield
    call_command("migrate", database=alias, verbosity=0)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.usefixtures("restores_schema")
def test_the_migration_derives_old_rows_error_types_in_batches(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(error_type_migration, "BATCH", 2)  # several batches
    call_command("migrate", "django_venturi", "0015_schedule_state", database=alias, verbosity=0)
    errors = ["builtins.ValueError: bad\nTraceback", "merged into job #1", "", "x.Y: z", "a.B: c"]
    table = connections[alias].ops.quote_name("django_venturi_job")
    with connections[alias].cursor() as cursor:
        for last_error in errors:
            cursor.execute(
                f"INSERT INTO {table} (kind, queue, priority, rank, state, payload, merged_count,"
                " attempt, failures, run_at, enqueued_at, claimed_by, last_error, waiting_for,"
                " dependents) VALUES ('tests.noop', 'default', 1, 0, 'ready', '{}', 0, 0, 0,"
                " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, '', %s, 0, 0)",
                [last_error],
            )
    call_command("migrate", "django_venturi", "0017_error_type", database=alias, verbosity=0)
    stored = Job.objects.using(alias).order_by("id").values_list("error_type", flat=True)
    assert list(stored) == ["builtins.ValueError", "", "", "x.Y", "a.B"]


@pytest.mark.django_db
def test_the_job_list_shows_the_largest_twenty_groups(admin_client: Client) -> None:
    for n in range(25):
        for _ in range(1 + (n == 7)):
            failed_with("builtins.ValueError", f"order {n} broken")
    page = admin_client.get(f"{CHANGELIST}?has_error=yes").content.decode()
    assert "builtins.ValueError</a>" not in page  # the short name links; the type is its title
    assert page.count('title="builtins.ValueError">ValueError</a>') == 20
    assert page.index("order 7 broken") < page.index("order 24 broken")  # the largest first
    assert "And 5 smaller groups" in page
