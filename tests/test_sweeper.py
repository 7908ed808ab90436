"""Retention run by workers: VENTURI["RETENTION"], one sweep at a time, and its checks."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import psycopg
import pytest
from django.test import override_settings
from django.utils import timezone

from django_venturi.checks import check_settings
from django_venturi.models import Job
from django_venturi.store.claim import CAPS_LOCK_KEY
from django_venturi.store.connections import connection_params
from django_venturi.worker import sweeper
from tests.conftest import Workers, wait_until

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

POLICY = {"completed": "7d", "cancelled": timedelta(hours=1)}


def finished(alias: str, state: str, age: timedelta) -> Job:
    return Job.objects.using(alias).create(
        kind="tests.noop",
        payload={"n": 1},
        state=state,
        attempt=1,
        failures=1 if state == "failed" else 0,
        finished_at=timezone.now() - age,
    )


def test_a_sweep_deletes_what_the_policy_no_longer_keeps(alias: str) -> None:
    old = finished(alias, "completed", timedelta(days=8))
    recent = finished(alias, "completed", timedelta(days=6))
    old_cancelled = finished(alias, "cancelled", timedelta(hours=2))
    old_failed = finished(alias, "failed", timedelta(days=100))  # not in the policy: kept
    with override_settings(VENTURI={"RETENTION": POLICY}):
        results = sweeper.sweep(alias)
    assert results is not None
    assert results["completed"].jobs == 1 and results["cancelled"].jobs == 1
    left = set(Job.objects.using(alias).values_list("pk", flat=True))
    assert left == {recent.pk, old_failed.pk}
    assert old.pk not in left and old_cancelled.pk not in left


def test_a_sweep_logs_what_it_deleted_in_words(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    """It read "deleted 1 completed jobs older than 7 days, 0:00:00 (1 journal entries)"."""
    finished(alias, "completed", timedelta(days=8))
    with override_settings(VENTURI={"RETENTION": POLICY}), caplog.at_level("INFO"):
        sweeper.sweep(alias)
    assert "retention: deleted 1 job and 0 journal entries (completed, finished more than" in (
        caplog.text
    )


def test_without_a_policy_a_sweep_deletes_nothing(alias: str) -> None:
    finished(alias, "completed", timedelta(days=800))
    assert sweeper.sweep(alias) == {}
    assert Job.objects.using(alias).count() == 1


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_one_sweep_at_a_time_on_postgresql() -> None:
    finished("default", "completed", timedelta(days=8))
    other = psycopg.connect(**connection_params("default"), autocommit=True)
    try:
        other.execute("SELECT pg_advisory_lock(%s)", [sweeper.ADVISORY_LOCK_KEY])
        with override_settings(VENTURI={"RETENTION": POLICY}):
            assert sweeper.sweep("default") is None  # another process is sweeping
            assert Job.objects.count() == 1
            other.execute("SELECT pg_advisory_unlock(%s)", [sweeper.ADVISORY_LOCK_KEY])
            assert sweeper.sweep("default") is not None
        assert Job.objects.count() == 0
    finally:
        other.close()


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_claim_of_a_capped_kind_does_not_make_a_sweep_skip_its_turn() -> None:
    finished("default", "completed", timedelta(days=8))
    claimer = psycopg.connect(**connection_params("default"))
    try:
        claimer.execute("SELECT pg_advisory_xact_lock(%s)", [CAPS_LOCK_KEY])  # held until rollback
        with override_settings(VENTURI={"RETENTION": POLICY}):
            results = sweeper.sweep("default")
        assert results is not None and results["completed"].jobs == 1
    finally:
        claimer.rollback()
        claimer.close()


def test_workers_sweep_when_retention_is_set(
    alias: str, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = [finished(alias, "completed", timedelta(days=30)) for _ in range(5)]
    kept = finished(alias, "failed", timedelta(days=30))
    monkeypatch.setenv("VENTURI_TEST_SETTINGS", json.dumps({"RETENTION": {"completed": "1d"}}))
    assert "VENTURI_TEST_SETTINGS" in os.environ
    workers.start(alias)
    workers.start(alias)  # two workers, one sweep at a time
    wait_until(
        lambda: not Job.objects.using(alias).filter(pk__in=[job.pk for job in old]).exists(),
        timeout=60,
        message="the workers' first sweep",
    )
    assert Job.objects.using(alias).filter(pk=kept.pk).exists()


@pytest.mark.parametrize(
    ("retention", "fragment"),
    [
        ("7d", "must be a dict"),
        ({"ready": "7d"}, "keys must be finished states"),
        ({"completed": "soon"}, "expected an age like 7d"),
        ({"completed": 0}, "must be a positive age"),
    ],
)
def test_a_bad_retention_setting_is_a_system_check_error(retention: object, fragment: str) -> None:
    with override_settings(VENTURI={"RETENTION": retention}):
        messages = check_settings()
    assert [message.id for message in messages] == ["venturi.E035"]
    assert "VENTURI['RETENTION']" in messages[0].msg and fragment in messages[0].msg


def test_a_good_retention_setting_passes() -> None:
    with override_settings(VENTURI={"RETENTION": {"completed": "7d", "failed": 86400}}):
        assert check_settings() == []
