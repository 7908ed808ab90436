"""Retry now: failed and ready jobs become due at once; a dedup clash is reported, not raised."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.db import IntegrityError, connections

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.registry import registry
from django_venturi.store import verdicts
from django_venturi.store.claim import ClaimRequest, claim
from django_venturi.store.completion import write_verdicts
from django_venturi.store.retry import retry_now
from django_venturi.store.scheduling import TierClock
from tests.testapp.dedup_tasks import Once

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def failed_job(alias: str, name: str) -> int:
    Once(name=name).enqueue(using=alias)
    request = ClaimRequest(
        worker="w", limit=1, kinds=["tests.once"], leases=[timedelta(minutes=5)], queues=None
    )
    (run,) = claim(alias, request, TierClock((6, 3, 1)))
    write_verdicts(alias, "w", [verdicts.failed(run, verdicts.ErrorInfo("E", "no"))])
    return run.id


def test_a_failed_job_whose_key_has_a_ready_job_is_a_clash(alias: str) -> None:
    failed = failed_job(alias, "k")
    twin = Once(name="k").enqueue(using=alias)
    result = retry_now([failed, twin.pk, 10**9], using=alias)
    assert (result.retried, result.clashes, result.skipped) == ([twin.pk], [failed], [10**9])
    assert Job.objects.using(alias).get(pk=failed).state == venturi.State.FAILED


def test_another_integrity_error_is_raised_not_reported_as_a_clash(alias: str) -> None:
    """Every IntegrityError used to be taken for a dedup clash, hiding the project's own."""
    failed = failed_job(alias, "k")
    table = connections[alias].ops.quote_name(Job._meta.db_table)
    with connections[alias].cursor() as cursor:
        if alias == "default":
            cursor.execute(
                "CREATE FUNCTION venturi_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'no retries here' USING ERRCODE = 'check_violation'; "
                "END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER venturi_test_refuse BEFORE UPDATE OF state ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION venturi_test_refuse()"
            )
            drops = [
                f"DROP TRIGGER venturi_test_refuse ON {table}",
                "DROP FUNCTION venturi_test_refuse()",
            ]
        else:
            cursor.execute(
                f"CREATE TRIGGER venturi_test_refuse BEFORE UPDATE OF state ON {table} "
                "BEGIN SELECT RAISE(ABORT, 'no retries here'); END"
            )
            drops = ["DROP TRIGGER venturi_test_refuse"]
    try:
        with pytest.raises(IntegrityError, match="no retries here"):
            retry_now([failed], using=alias)
        assert Job.objects.using(alias).get(pk=failed).state == venturi.State.FAILED
    finally:
        with connections[alias].cursor() as cursor:
            for drop in drops:
                cursor.execute(drop)


@venturi.task(kind="tests.retry_twice", max_attempts=2)
@dataclasses.dataclass
class RetryTwice(venturi.Task):
    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.retry()


def run_once_and_ask_for_a_retry(alias: str) -> Job:
    request = ClaimRequest(
        worker="w", limit=1, kinds=["tests.retry_twice"], leases=[timedelta(minutes=5)], queues=None
    )
    (run,) = claim(alias, request, TierClock((6, 3, 1)))
    spec = registry.get("tests.retry_twice")
    verdict = verdicts.from_outcome(run, spec, venturi.Outcome.retry(after=timedelta(0)))
    write_verdicts(alias, "w", [verdict])
    return Job.objects.using(alias).get(pk=run.id)


def test_a_manual_retry_grants_a_fresh_set_of_attempts_and_says_so_truly(alias: str) -> None:
    """It used to keep the failure count: 'gave up after 3 failed attempts (max_attempts=2)'."""
    job_id = RetryTwice().enqueue(using=alias).pk
    assert run_once_and_ask_for_a_retry(alias).state == venturi.State.READY
    gave_up = run_once_and_ask_for_a_retry(alias)
    assert (gave_up.state, gave_up.failures) == (venturi.State.FAILED, 2)
    assert gave_up.last_error.startswith("Outcome.retry: gave up after 2 failed attempts (max")

    assert retry_now([job_id], using=alias).retried == [job_id]
    retried = Job.objects.using(alias).get(pk=job_id)
    assert (retried.state, retried.failures, retried.attempt) == (venturi.State.READY, 0, 2)
    assert run_once_and_ask_for_a_retry(alias).state == venturi.State.READY  # not at once
    again = run_once_and_ask_for_a_retry(alias)
    assert (again.state, again.attempt, again.failures) == (venturi.State.FAILED, 4, 2)
    assert again.last_error == (
        "Outcome.retry: gave up after 2 failed attempts (max_attempts=2)"
        "; last error: the handler returned Outcome.retry()"
    )
    journal = JournalEntry.objects.using(alias).filter(job_id=job_id).order_by("id")
    assert [entry.outcome for entry in journal] == ["retry", "failed", "retry", "failed"]


def test_a_returned_outcome_is_named_once_in_the_run_summary() -> None:
    """The worker logs `<outcome>: <summary>`: it read 'retry: retry: the handler asked ...'."""
    asked = verdicts.ErrorInfo.from_reason("the handler returned Outcome.retry()", "Outcome.retry")
    assert asked.summary() == "the handler returned Outcome.retry()"
    refused = verdicts.ErrorInfo.from_reason("out of stock", type="Outcome.failed")
    assert refused.summary() == "out of stock"
    raised = verdicts.ErrorInfo.from_reason("bad", type="builtins.ValueError")
    assert raised.summary() == "ValueError: bad"
