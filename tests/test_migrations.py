"""Upgrade safety: every migration goes backward and forward, and a worker refuses a schema
that is behind its code."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_venturi.migration_state import migration_errors, unapplied_migrations
from tests.conftest import ROOT, Workers, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])


def migrate(alias: str, target: str) -> None:
    call_command("migrate", "django_venturi", target, database=alias, verbosity=0)


def tables(alias: str) -> set[str]:
    with connections[alias].cursor() as cursor:
        return set(connections[alias].introspection.table_names(cursor))


@pytest.fixture
def restores_schema(alias: str) -> Iterator[None]:
    """Whatever the test does to the schema, the next test finds it whole again."""
    yield
    call_command("migrate", database=alias, verbosity=0)


@pytest.mark.usefixtures("restores_schema")
def test_all_migrations_go_backward_and_forward(alias: str) -> None:
    assert unapplied_migrations(alias) == []
    migrate(alias, "zero")
    assert not {name for name in tables(alias) if name.startswith("django_venturi_")}
    assert unapplied_migrations(alias)[0] == "0001_initial"

    call_command("migrate", "django_venturi", database=alias, verbosity=0)  # to the latest
    assert {"django_venturi_job", "django_venturi_journalentry"} <= tables(alias)
    assert unapplied_migrations(alias) == []
    # The jobs table works after the round trip.
    job = tasks.Noop(n=1).enqueue(using=alias)
    assert job.pk is not None


@pytest.mark.usefixtures("restores_schema")
def test_a_worker_refuses_a_database_whose_migrations_are_behind(
    alias: str, workers: Workers
) -> None:
    migrate(alias, "0003_dedup")
    [error] = migration_errors(alias)
    assert error.id == "venturi.E030"
    assert "0004_schema_for_operations" in error.msg

    # Read from the files and the recorder; the migration graph, which the check loads
    # when MIGRATION_MODULES moved the app's migrations, says the same.
    from_files = unapplied_migrations(alias)
    assert from_files[0] == "0004_schema_for_operations"
    with override_settings(MIGRATION_MODULES={"django_venturi": "django_venturi.migrations"}):
        assert unapplied_migrations(alias) == from_files
    result = subprocess.run(
        workers.command(alias, "--burst"),
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "venturi.E030" in result.stderr
    assert "0004_schema_for_operations, 0005_indexes_for_operations, 0006" in result.stderr
    assert "manage.py migrate django_venturi" in result.stderr


def test_manage_py_check_database_reports_it_and_plain_check_does_not() -> None:
    from django.core.checks import run_checks

    def venturi_ids(messages: list[Any]) -> list[str]:
        return [m.id for m in messages if m.id in ("venturi.E030", "venturi.W030")]

    assert venturi_ids(run_checks(databases=["default"])) == []
    migrate("default", "0004_schema_for_operations")
    try:
        assert venturi_ids(run_checks(databases=["default"])) == ["venturi.W030"]
        assert venturi_ids(run_checks()) == []  # no database touched without --database
    finally:
        call_command("migrate", database="default", verbosity=0)


def test_a_first_install_gets_no_warning_from_migrate() -> None:
    """No venturi table yet is not an upgrade: `migrate` creates them without warning."""
    from django.core.checks import run_checks

    migrate("default", "zero")
    try:
        assert not [m for m in run_checks(databases=["default"]) if m.id == "venturi.W030"]
        assert [m.id for m in migration_errors("default")] == ["venturi.E030"]  # the worker refuses
    finally:
        call_command("migrate", database="default", verbosity=0)


def test_manage_py_migrate_applies_what_the_check_reports_missing() -> None:
    """`migrate` runs database checks: the missing migrations must not block it."""
    migrate("default", "0004_schema_for_operations")
    try:
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "django_venturi", "--database", "default"],
            env=worker_env(),
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=120,
        )
        assert unapplied_migrations("default") == []
    finally:
        call_command("migrate", database="default", verbosity=0)
