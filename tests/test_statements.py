"""The hot statements on PostgreSQL: prepared server-side, or not, with the same results."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_venturi as venturi
from django_venturi import verdicts
from django_venturi.claim import ClaimedJob, ClaimRequest, claim
from django_venturi.completion import write_verdicts
from django_venturi.models import Job, JournalEntry
from django_venturi.registry import registry
from django_venturi.scheduling import TierClock
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


@pytest.fixture(autouse=True)
def fresh_connection() -> None:
    """Prepared statements live as long as the connection: start each test on a new one."""
    connections["default"].close()


PREPARED = "SELECT statement FROM pg_prepared_statements"


def prepared_statements() -> list[str]:
    with connections["default"].cursor() as cursor:
        cursor.execute(PREPARED)
        return [row[0] for row in cursor.fetchall()]


def claim_noops(limit: int = 10) -> list[ClaimedJob]:
    request = ClaimRequest(
        worker="test", limit=limit, kinds=["tests.noop"], leases=[timedelta(minutes=5)], queues=None
    )
    return claim("default", request, TierClock((6, 3, 1)))


def enqueue_claim_complete() -> list[int]:
    Noop(n=1).enqueue()
    venturi.enqueue_many([Noop(n=2), Noop(n=3)])
    jobs = claim_noops()
    spec = registry.get("tests.noop")
    written = write_verdicts(
        "default",
        "test",
        [verdicts.from_outcome(job, spec, venturi.Outcome.completed()) for job in jobs],
    )
    return sorted(written)


def test_the_claim_the_verdicts_and_the_enqueues_are_prepared() -> None:
    ids = enqueue_claim_complete()
    assert len(ids) == 3
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"completed"}
    assert JournalEntry.objects.filter(job_id__in=ids, outcome="completed").count() == 3
    statements = prepared_statements()
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone() == ("force_custom_plan",)
    assert any("INSERT INTO" in sql and "pg_notify" in sql for sql in statements)
    assert any("FOR UPDATE SKIP LOCKED" in sql for sql in statements)
    assert any("INSERT INTO" in sql and "verdict" in sql for sql in statements)


def test_prepared_statements_can_be_switched_off() -> None:
    with override_settings(VENTURI={"PREPARED_STATEMENTS": False}):
        ids = enqueue_claim_complete()
    assert len(ids) == 3
    assert JournalEntry.objects.filter(job_id__in=ids, outcome="completed").count() == 3
    assert prepared_statements() == []


def test_django_query_log_still_sees_them() -> None:
    with CaptureQueriesContext(connections["default"]) as queries:
        Noop(n=1).enqueue()
        claim_noops()
    logged = [query["sql"] for query in queries.captured_queries]
    assert any("pg_notify" in sql for sql in logged)
    assert any("SKIP LOCKED" in sql for sql in logged)


def test_a_prepared_enqueue_rolls_back_with_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Noop(n=1).enqueue()
        venturi.enqueue_many([Noop(n=2), Noop(n=3)])
        raise RuntimeError("the caller's transaction fails")
    assert Job.objects.count() == 0
    assert Noop(n=4).enqueue().pk is not None  # the connection is still usable


def plan_cache_mode() -> str:
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        (mode,) = cursor.fetchone()
    return str(mode)


def test_an_enqueueing_connection_keeps_generic_plans() -> None:
    """A web process's connection: the insert is prepared and PostgreSQL may reuse its plan."""
    with transaction.atomic():
        Noop(n=1).enqueue()
    Noop(n=2).enqueue()
    assert [sql for sql in prepared_statements() if "INSERT INTO" in sql]
    assert plan_cache_mode() == "auto"


def test_a_claim_inside_a_transaction_runs_unprepared_until_its_settings_can_be_set() -> None:
    # A generic plan of the claim scans the table: it is prepared only on a
    # connection where `force_custom_plan` could be set, outside a transaction.
    Noop(n=1).enqueue()
    with transaction.atomic():
        assert len(claim_noops()) == 1
        assert not [sql for sql in prepared_statements() if "SKIP LOCKED" in sql]
        assert plan_cache_mode() == "auto"
    Noop(n=2).enqueue()
    assert len(claim_noops()) == 1
    assert [sql for sql in prepared_statements() if "SKIP LOCKED" in sql]
    assert plan_cache_mode() == "force_custom_plan"


@pytest.mark.parametrize("prepared", [True, False])
def test_a_claimed_payload_reads_the_same_on_both_paths(prepared: bool) -> None:
    # A JSON string payload (a tampered row) must not be decoded twice, nor a dict once.
    string_job, dict_job = Noop(n=1).enqueue(), Noop(n=2).enqueue()
    Job.objects.filter(pk=string_job.pk).update(payload="not an object", carry={"at": 3})
    with override_settings(VENTURI={"PREPARED_STATEMENTS": prepared}):
        claimed = {job.id: job for job in claim_noops()}
    assert claimed[string_job.pk].payload == "not an object"
    assert claimed[string_job.pk].carry == {"at": 3}
    assert claimed[dict_job.pk].payload == {"n": 2}
    assert claimed[dict_job.pk].carry is None
