"""`venturi_maintenance reindex`, its turn beside cleanups, the workers' schedule, the
job table's storage parameters; against the real PostgreSQL (and SQLite's refusal)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.test import override_settings

import django_venturi as venturi
from django_venturi.checks import check_maintenance
from django_venturi.migration_operations import SetStorageParameters
from django_venturi.models import Job, MaintenanceRun
from django_venturi.store.connections import connection_params
from django_venturi.store.maintenance import REINDEX, Skipped, run_reindex
from django_venturi.store.maintenance_lock import cleanup_turn, maintenance_turn
from django_venturi.store.reindex import indexes
from django_venturi.store.retention import cleanup
from django_venturi.worker.maintainer import maintain
from django_venturi.worker.sweeper import sweep
from tests.conftest import in_thread, result_of, wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

ALIAS = "default"
CLAIM_INDEX = "venturi_job_claim_rank_idx"


def query(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def job_indexes() -> dict[str, tuple[int, bool]]:
    """Index name -> (relfilenode, valid) of the job table's indexes."""
    rows = query(
        "SELECT c.relname, c.relfilenode, i.indisvalid FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
        [Job._meta.db_table],
    )
    return {name: (node, valid) for name, node, valid in rows}


def reindex_command(*args: str) -> str:
    out = io.StringIO()
    call_command("venturi_maintenance", "reindex", *args, stdout=out)
    return out.getvalue()


def test_the_migration_sets_the_job_tables_storage_parameters() -> None:
    rows = query("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [Job._meta.db_table])
    options = dict(option.split("=") for option in rows[0][0])
    assert options["autovacuum_vacuum_scale_factor"] == "0.01"
    assert options["autovacuum_vacuum_threshold"] == "1000"
    assert options["autovacuum_analyze_scale_factor"] == "0.01"
    assert "fillfactor" not in options, "no update of a job is HOT: it would only waste room"


def test_storage_parameters_refuse_a_name_that_is_not_one() -> None:
    with pytest.raises(ValueError, match="'fillfactor; DROP' is not a storage parameter"):
        SetStorageParameters("job", {"fillfactor; DROP": 1})


def test_reindex_rebuilds_every_index_of_the_job_table() -> None:
    tasks.Noop(n=1).enqueue()
    before = job_indexes()
    output = reindex_command()
    after = job_indexes()
    assert set(after) == set(before)
    assert all(valid for _, valid in after.values())
    assert all(after[name][0] != before[name][0] for name in before), "each one a new file"
    assert f"rebuilt {CLAIM_INDEX}:" in output
    assert f"{len(before)} indexes rebuilt, 0 leftovers dropped" in output
    run = MaintenanceRun.objects.get(task=REINDEX)
    assert run.finished_at is not None and f"rebuilt {CLAIM_INDEX}" in run.report


def test_a_dry_run_says_what_it_would_rebuild_and_rebuilds_nothing() -> None:
    before = job_indexes()
    output = reindex_command("--dry-run")
    assert f"would rebuild {CLAIM_INDEX}" in output
    assert job_indexes() == before
    assert not MaintenanceRun.objects.exists()


@contextmanager
def writer_holding_the_table() -> Iterator[psycopg.Connection[Any]]:
    """An open transaction that has written to the job table: a concurrent rebuild waits
    for it after making its new index, so the rebuild can be caught in the middle."""
    with psycopg.connect(**connection_params(ALIAS)) as writer:
        writer.execute(f"LOCK TABLE {Job._meta.db_table} IN ROW EXCLUSIVE MODE")
        yield writer
        writer.rollback()


def interrupt_a_reindex() -> None:
    """Start `REINDEX INDEX CONCURRENTLY` of the claim index, and terminate its backend
    from another connection once its new copy exists: the copy stays, invalid."""
    with writer_holding_the_table():
        rebuilding = psycopg.connect(**connection_params(ALIAS), autocommit=True)
        pid = rebuilding.info.backend_pid
        thread, box = in_thread(rebuilding.execute, f"REINDEX INDEX CONCURRENTLY {CLAIM_INDEX}")
        wait_until(
            lambda: f"{CLAIM_INDEX}_ccnew" in job_indexes(), message="the rebuild's new copy"
        )
        assert query("SELECT pg_terminate_backend(%s)", [pid]) == [(True,)]
        with pytest.raises(psycopg.OperationalError):
            result_of(thread, box)
        rebuilding.close()


def test_reindex_drops_the_leftover_of_an_interrupted_rebuild() -> None:
    interrupt_a_reindex()
    assert job_indexes()[f"{CLAIM_INDEX}_ccnew"][1] is False, "left behind, invalid"
    output = reindex_command()
    assert f"dropped {CLAIM_INDEX}_ccnew (left by an interrupted rebuild)" in output
    after = job_indexes()
    assert f"{CLAIM_INDEX}_ccnew" not in after
    assert CLAIM_INDEX in after and all(valid for _, valid in after.values())
    assert not [index for index in indexes(ALIAS) if index.leftover]


def test_reindex_refuses_sqlite_and_names_the_reason() -> None:
    with pytest.raises(CommandError, match="only PostgreSQL does; database 'sqlite' is SQLite"):
        reindex_command("--database", "sqlite")


def test_one_maintenance_run_at_a_time() -> None:
    with maintenance_turn(ALIAS) as taken:
        assert taken
        with pytest.raises(CommandError, match="another maintenance run or a cleanup"):
            reindex_command()
    assert not MaintenanceRun.objects.exists()


def test_a_cleanup_waits_for_a_maintenance_run_to_end() -> None:
    tasks.Noop(n=1).enqueue()
    Job.objects.update(
        state="completed", finished_at=query("SELECT now() - interval '1 day'")[0][0]
    )
    with maintenance_turn(ALIAS) as taken:
        assert taken
        thread, box = in_thread(lambda: cleanup(older_than=timedelta(hours=1), using=ALIAS))
        wait_until(cleanup_is_waiting, message="the cleanup waiting for the maintenance turn")
        assert Job.objects.count() == 1, "nothing deleted during the maintenance run"
    assert result_of(thread, box).jobs == 1


def cleanup_is_waiting() -> bool:
    """A session of the test database has tried the shared lock, and holds none."""
    tried = query(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'SELECT pg_try_advisory_lock_shared%%'"
    )
    shared = query(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock'"
    )
    return bool(tried[0][0]) and not shared[0][0]


def test_no_maintenance_run_begins_while_a_cleanup_runs() -> None:
    with cleanup_turn(ALIAS):
        assert run_reindex(ALIAS).skipped is Skipped.BUSY
    assert run_reindex(ALIAS).report is not None


@override_settings(VENTURI={"MAINTENANCE": {"REINDEX": "1h"}})
def test_the_workers_schedule_runs_one_reindex_per_interval() -> None:
    first = maintain(ALIAS)
    assert first is not None and first.report is not None and first.report.rebuilt
    second = maintain(ALIAS)
    assert second is not None and second.skipped is Skipped.NOT_DUE
    MaintenanceRun.objects.update(started_at=query("SELECT now() - interval '61 minutes'")[0][0])
    third = maintain(ALIAS)
    assert third is not None and third.report is not None


def test_without_the_setting_workers_do_no_maintenance() -> None:
    assert maintain(ALIAS) is None
    assert not MaintenanceRun.objects.exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1d", 'must be a dict like {"REINDEX": "1d"}, got \'1d\''),
        ({"VACUUM": "1d"}, "has 'VACUUM': keys must be among REINDEX"),
        ({"REINDEX": "daily"}, "['REINDEX']: expected an age like 7d"),
        ({"REINDEX": "10m"}, "['REINDEX'] must be at least 1h between runs, got '10m'"),
    ],
)
def test_a_bad_maintenance_setting_is_named_by_the_checks(value: object, message: str) -> None:
    errors = check_maintenance({"MAINTENANCE": value})
    assert [error.id for error in errors] == ["venturi.E045"]
    assert errors[0].msg.startswith("VENTURI['MAINTENANCE'] ")
    assert message in errors[0].msg


def test_a_good_maintenance_setting_passes_the_checks() -> None:
    assert check_maintenance({"MAINTENANCE": {"REINDEX": "1d"}}) == []
    assert check_maintenance({}) == []


def index_size(name: str) -> int:
    return int(query("SELECT pg_relation_size(%s::regclass)", [name])[0][0])


def test_reindex_shrinks_a_bloated_claim_index() -> None:
    venturi.enqueue_many([tasks.Noop(n=i) for i in range(20_000)])
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(f"DELETE FROM {Job._meta.db_table}")
        cursor.execute(f"VACUUM {Job._meta.db_table}")  # the room is reusable, not given back
    tasks.Noop(n=1).enqueue()
    bloated = index_size(CLAIM_INDEX)
    reindex_command()
    assert index_size(CLAIM_INDEX) < bloated / 10
    assert Job.objects.filter(state="ready").count() == 1


def snapshots_held_by_others() -> list[tuple[Any, ...]]:
    """Sessions of the test database (not this one) whose snapshot a rebuild would wait for."""
    return query(
        "SELECT pid, state, query FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL"
    )


@override_settings(VENTURI={"RETENTION": {"completed": "1h"}})
def test_a_sweep_waiting_for_a_maintenance_run_holds_no_snapshot() -> None:
    with maintenance_turn(ALIAS) as taken:
        assert taken
        thread, box = in_thread(sweep, ALIAS)
        wait_until(cleanup_is_waiting, message="the sweep waiting for the maintenance turn")
        assert snapshots_held_by_others() == [], "a rebuild would wait for the sweep forever"
    assert result_of(thread, box)["completed"].jobs == 0


def test_a_cleanup_inside_a_transaction_does_not_wait_for_a_maintenance_run() -> None:
    with maintenance_turn(ALIAS) as taken, transaction.atomic(using=ALIAS):
        assert taken
        assert cleanup(older_than=timedelta(hours=1), using=ALIAS).jobs == 0
