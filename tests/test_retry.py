"""Retry now: failed and ready jobs become due at once; a dedup clash is reported, not raised."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connections

import django_venturi as venturi
from django_venturi import verdicts
from django_venturi.claim import ClaimRequest, claim
from django_venturi.completion import write_verdicts
from django_venturi.models import Job
from django_venturi.retry import retry_now
from django_venturi.scheduling import TierClock
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
