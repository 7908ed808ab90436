"""The job table's health figures (`observe/table_health.py`) in `venturi_stats` and on the
admin's stats page, against the real PostgreSQL (and the counts SQLite has)."""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import django_venturi as venturi
from django_venturi.models import Job
from django_venturi.observe.table_health import DEAD_ROWS_WARNING, TableHealth, table_health
from tests.conftest import wait_until
from tests.test_maintenance import CLAIM_INDEX, interrupt_a_reindex
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

ALIAS = "default"


def dead_rows_of_the_job_table() -> int:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_get_dead_tuples(%s::regclass)", [Job._meta.db_table])
        return int(cursor.fetchone()[0])


def autovacuum_is_on() -> bool:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return bool(cursor.fetchone()[0] == "on")


def test_rows_by_state_count_the_live_states(alias: str) -> None:
    tasks.Noop(n=1).enqueue(using=alias)
    tasks.Noop(n=2).enqueue(using=alias)
    running = tasks.Noop(n=3).enqueue(using=alias)
    lease = timezone.now() + timedelta(minutes=5)
    Job.objects.using(alias).filter(id=running.id).update(
        state="running", lease_expires_at=lease, claim_token=uuid.uuid4()
    )
    health = table_health(using=alias)
    assert health.rows_by_state["ready"] == 2
    assert health.rows_by_state["running"] == 1
    assert health.rows_by_state["waiting"] == 0
    assert set(health.rows_by_state) == {"waiting", "ready", "running", "finished"}


def test_postgresql_reports_sizes_dead_rows_and_warns_past_the_threshold() -> None:
    venturi.enqueue_many([tasks.Noop(n=i) for i in range(DEAD_ROWS_WARNING + 500)])
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(f"DELETE FROM {Job._meta.db_table}")
    wait_until(lambda: dead_rows_of_the_job_table() > DEAD_ROWS_WARNING, message="dead rows")
    health = table_health(using=ALIAS)
    assert health.dead_rows is not None and health.dead_rows > DEAD_ROWS_WARNING
    assert health.table_bytes and health.table_bytes > 1 << 20
    assert health.index_bytes and health.index_bytes > 0
    assert any(
        "dead rows" in warning and "autovacuum is not keeping up" in warning
        for warning in health.warnings
    ), health.warnings
    off = "autovacuum is off on this server: nothing reclaims what updates and deletes leave"
    assert (off in health.warnings) is not autovacuum_is_on()


def test_a_vacuumed_table_has_no_dead_row_warning() -> None:
    tasks.Noop(n=1).enqueue()
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(f"VACUUM {Job._meta.db_table}")
    wait_until(lambda: dead_rows_of_the_job_table() == 0, message="no dead rows")
    health = table_health(using=ALIAS)
    assert not [warning for warning in health.warnings if "dead rows" in warning]


def test_the_leftover_of_an_interrupted_rebuild_is_a_warning_until_reindex() -> None:
    interrupt_a_reindex()
    warning = f"{CLAIM_INDEX}_ccnew is left by an interrupted rebuild"
    assert any(text.startswith(warning) for text in table_health(using=ALIAS).warnings)
    call_command("venturi_maintenance", "reindex", stdout=io.StringIO())
    health = table_health(using=ALIAS)
    assert not any(text.startswith(warning) for text in health.warnings)
    assert health.last_reindex is not None


def test_venturi_stats_shows_the_health_as_text_and_json() -> None:
    tasks.Noop(n=1).enqueue()
    text = io.StringIO()
    call_command("venturi_stats", stdout=text)
    assert f"job table {Job._meta.db_table}: 0 waiting, 1 ready, 0 running" in text.getvalue()
    assert "dead rows; table " in text.getvalue()
    as_json = io.StringIO()
    call_command("venturi_stats", "--json", stdout=as_json)
    health = json.loads(as_json.getvalue())["table_health"]
    assert health["rows_by_state"]["ready"] == 1
    assert health["table"] == Job._meta.db_table and health["table_bytes"] > 0


def test_the_admins_stats_page_shows_the_health(admin_client: Client) -> None:
    tasks.Noop(n=1).enqueue()
    response = admin_client.get(reverse("admin:django_venturi_job_stats"))
    assert isinstance(response.context["table_health"], TableHealth)
    page = response.content.decode()
    assert 'id="venturi-table-health"' in page
    assert f"The job table's health ({Job._meta.db_table})" in page
    assert "<th>dead rows</th>" in page and "<th>last reindex</th>" in page
