"""The hot statements on PostgreSQL: prepared server-side, or not, with the same results."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_venturi as venturi
from django_venturi import testing as venturi_testing
from django_venturi.models import Job, JournalEntry
from django_venturi.registry import registry
from django_venturi.store import statements, verdicts
from django_venturi.store.claim import (
    ClaimedJob,
    ClaimRequest,
    KindLimit,
    claim,
    prime_claim_session,
)
from django_venturi.store.completion import write_verdicts
from django_venturi.store.scheduling import TierClock
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


def noop_request(limit: int = 10) -> ClaimRequest:
    return ClaimRequest(
        worker="test", limit=limit, kinds=["tests.noop"], leases=[timedelta(minutes=5)], queues=None
    )


def claim_noops(limit: int = 10) -> list[ClaimedJob]:
    return claim("default", noop_request(limit), TierClock((6, 3, 1)))


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
    assert any("INSERT INTO" in sql and "RETURNING id" in sql for sql in statements)
    # The enqueue's transaction sends no NOTIFY: the commit lock (waiting_workers.py).
    assert not any("INSERT INTO" in sql and "pg_notify" in sql for sql in statements)
    assert any("FOR UPDATE SKIP LOCKED" in sql for sql in statements)
    assert any("INSERT INTO" in sql and "verdict" in sql for sql in statements)


def test_prepared_statements_can_be_switched_off() -> None:
    with override_settings(VENTURI={"PREPARED_STATEMENTS": False}):
        ids = enqueue_claim_complete()
    assert len(ids) == 3
    assert JournalEntry.objects.filter(job_id__in=ids, outcome="completed").count() == 3
    assert prepared_statements() == []
    # Switched off means left alone: the connection's own setting is not touched.
    assert connections["default"].connection.prepare_threshold is None


def test_django_query_log_still_sees_them() -> None:
    with CaptureQueriesContext(connections["default"]) as queries:
        Noop(n=1).enqueue()
        claim_noops()
    logged = [query["sql"] for query in queries.captured_queries]
    assert any("INSERT INTO" in sql for sql in logged)
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
    # Its settings (no JIT, a generic plan) can only be set outside a transaction:
    # until they are, it runs unnamed.
    Noop(n=1).enqueue()
    with transaction.atomic():
        assert len(claim_noops()) == 1
        assert not [sql for sql in prepared_statements() if "SKIP LOCKED" in sql]
        assert plan_cache_mode() == "auto"
    Noop(n=2).enqueue()
    assert len(claim_noops()) == 1
    assert [sql for sql in prepared_statements() if "SKIP LOCKED" in sql]
    assert plan_cache_mode() == "force_generic_plan"


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


def claim_plans() -> tuple[int, int]:
    """(generic, custom) plans PostgreSQL made for the prepared claim statement."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%SKIP LOCKED%%'"
        )
        ((generic, custom),) = cursor.fetchall()
    return int(generic), int(custom)


def test_the_lean_claim_keeps_one_generic_plan() -> None:
    for n in range(8):
        Noop(n=n).enqueue()
        assert len(claim_noops()) == 1
    assert claim_plans() == (8, 0)
    assert plan_cache_mode() == "force_generic_plan"


@pytest.mark.parametrize(
    "cap",
    [
        KindLimit(kind="tests.noop", global_cap=None, local_room=2),  # counted by the worker
        KindLimit(kind="tests.noop", global_cap=5, local_room=None),  # behind the caps lock
    ],
    ids=["local", "global"],
)
def test_the_claim_of_capped_kinds_keeps_one_generic_plan(cap: KindLimit) -> None:
    """Its plan follows from its shape too: planning it for its values cost 2 ms a
    claim. The globally capped one goes in a pipeline after the caps lock's statement."""
    request = ClaimRequest(
        worker="test",
        limit=10,
        kinds=["tests.noop"],
        leases=[timedelta(minutes=5)],
        queues=None,
        limits=[cap],
    )
    for n in range(3):
        Noop(n=n).enqueue()
        claimed = claim("default", request, TierClock((6, 3, 1)))
        assert len(claimed) == 1 and not claimed.counted_later
        Job.objects.filter(pk=claimed[0].id).update(
            state=venturi.State.COMPLETED, finished_at=timezone.now()
        )
    assert claim_plans() == (3, 0)
    assert plan_cache_mode() == "force_generic_plan"


def test_one_connection_switches_the_plan_mode_for_the_statement_that_needs_it() -> None:
    """The verdict write after a lean claim gets its custom plans back, and the next
    claim its generic one: each statement runs in its own mode, whatever ran before."""
    spec = registry.get("tests.noop")
    for n in range(3):
        Noop(n=n).enqueue()
        (job,) = claim_noops()
        assert plan_cache_mode() == "force_generic_plan"
        verdict = verdicts.from_outcome(job, spec, venturi.Outcome.completed())
        assert write_verdicts("default", "test", [verdict]) == {job.id}
        assert plan_cache_mode() == "force_custom_plan"
    assert claim_plans() == (3, 0)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%verdict%%'"
        )
        assert cursor.fetchall() == [(0, 3)]


def test_a_settings_change_inside_a_transaction_waits_for_its_end() -> None:
    Noop(n=1).enqueue()
    assert len(claim_noops()) == 1
    with transaction.atomic():
        statements.fetch("default", "SELECT 1", [], session=statements.WORKER_SESSION)
        assert plan_cache_mode() == "force_generic_plan"  # no SET that would roll back
    statements.fetch("default", "SELECT 1", [], session=statements.WORKER_SESSION)
    assert plan_cache_mode() == "force_custom_plan"


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("SELECT 1 -- one", "SELECT 1 "),
        ("-- a whole line", ""),
        ("WHERE note = '--not a comment' -- a comment", "WHERE note = '--not a comment' "),
        ("WHERE a = '' AND b = 'it''s' -- end", "WHERE a = '' AND b = 'it''s' "),
        ("no comment at all", "no comment at all"),
    ],
)
def test_comments_are_dropped_outside_quoted_strings(line: str, kept: str) -> None:
    assert statements._without_comment(line) == kept


def test_a_generic_claim_made_on_an_empty_table_still_walks_the_indexes() -> None:
    """The plan is made once, on whatever statistics the table has then: here an
    empty, analyzed table. Once a backlog arrives (not analyzed yet), the claim must
    not scan the whole table (it did, at a third of the speed, before INDEX_SCANS)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("VACUUM ANALYZE django_venturi_job")
    for _ in range(2):
        assert claim_noops() == []  # the generic plan is made, for an empty table
    venturi.enqueue_many([Noop(n=n) for n in range(2000)])
    with transaction.atomic():
        assert len(claim_noops()) == 10
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables"
                " WHERE relname = 'django_venturi_job'"
            )
            seq_scans, index_scans = cursor.fetchone()
    assert claim_plans() == (3, 0)
    assert (seq_scans, index_scans > 0) == (0, True)


def planner() -> tuple[str, str, str]:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('enable_seqscan'), current_setting('enable_bitmapscan'),"
            " current_setting('plan_cache_mode')"
        )
        row = cursor.fetchone()
    return row[0], row[1], row[2]


def test_testing_drain_leaves_the_planner_as_it_found_it() -> None:
    """The test's own queries after `drain()` are planned as PostgreSQL would."""
    for n in range(3):
        Noop(n=n).enqueue()
    assert len(venturi_testing.drain()) == 3
    assert planner() == ("on", "on", "auto")


def test_a_connection_the_project_prepares_on_keeps_its_planner() -> None:
    """Where the project set `prepare_threshold`, the claim runs unnamed and its
    generic-plan settings would reach only the project's own statements: left off."""
    connection = connections["default"]
    connection.ensure_connection()
    connection.connection.prepare_threshold = 5
    Noop(n=1).enqueue()
    assert len(claim_noops()) == 1
    assert not [sql for sql in prepared_statements() if "SKIP LOCKED" in sql]
    assert planner() == ("on", "on", "auto")


def test_an_idle_worker_leaves_the_planner_of_a_connection_the_project_prepares_on() -> None:
    """What an idle worker runs before it sleeps (the claim's session, set ahead)
    keeps to the same rule as the claim itself on such a connection."""
    connection = connections["default"]
    connection.ensure_connection()
    connection.connection.prepare_threshold = 5
    prime_claim_session("default", noop_request())
    assert planner() == ("on", "on", "auto")


def test_testing_drain_in_a_failed_transaction_raises_the_failure_not_a_reset_error() -> None:
    """The planner reset after `drain()` must not hide why the test's transaction failed."""
    Noop(n=1).enqueue()
    assert len(claim_noops()) == 1  # the session now has the claim's planner settings
    with pytest.raises(IntegrityError), transaction.atomic():
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("INSERT INTO django_venturi_job (id) VALUES (NULL)")
        finally:
            statements.reset_planner("default")  # the transaction has failed: runs nothing
    statements.reset_planner("default")
    assert planner() == ("on", "on", "auto")
