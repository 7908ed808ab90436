"""The gaps a newcomer meets each say what is wrong: no live worker for due jobs, jobs a
starting worker cannot run, and venturi's migrations never applied."""

from __future__ import annotations

import importlib
import io
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, ProgrammingError, connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_venturi.migration_state import unapplied_migrations
from django_venturi.models import Job, WorkerProcess
from django_venturi.store import missing_tables, registration
from django_venturi.tasks_backend import frameworks
from tests.conftest import Workers, django_command
from tests.testapp.tasks import Noop

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

TASK_MODULES = {
    "django.tasks": "tests.testapp.tasks_django",
    "django_tasks": "tests.testapp.tasks_backport",
}
"""The test task functions of each Tasks framework (as in tests/test_django_tasks.py)."""


def waiting(alias: str, kind: str, queue: str = "default", *, jobs: int = 1) -> None:
    """Ready, due rows of `kind`, as a producer whose task no worker has writes them."""
    for _ in range(jobs):
        Job.objects.using(alias).create(kind=kind, queue=queue, payload={})


def check_orphans(alias: str) -> str:
    out = io.StringIO()
    call_command("venturi_stats", "--check-orphans", "--database", alias, stdout=out)
    return out.getvalue().strip()


# ---------------------------------------------------------------- venturi_stats --check-orphans


def test_check_orphans_fails_when_due_jobs_wait_and_no_worker_is_live(alias: str) -> None:
    Noop(n=1).enqueue(using=alias)
    Noop(n=2).enqueue(using=alias, queue="emails")
    waiting(alias, "shop.SendMail")
    with pytest.raises(CommandError) as raised:
        check_orphans(alias)
    message = str(raised.value)
    assert message.startswith("3 due jobs (2 in default, 1 in emails) and no live worker")
    assert "manage.py venturi_worker" in message


def test_check_orphans_names_the_stale_workers_when_none_is_live(alias: str) -> None:
    Noop(n=1).enqueue(using=alias)
    registration.register(alias, name="gone", queues=None, concurrency=1, kinds=["tests.noop"])
    WorkerProcess.objects.using(alias).filter(name="gone").update(
        heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    with pytest.raises(CommandError, match=r"^1 due job \(1 in default\) .*; stale: gone"):
        check_orphans(alias)


def test_check_orphans_says_plainly_when_nothing_is_due(alias: str) -> None:
    assert check_orphans(alias) == "ok: no job is due (and no worker is live)"
    Job.objects.using(alias).create(
        kind="tests.noop", queue="default", payload={}, run_at=timezone.now() + timedelta(hours=1)
    )  # scheduled, not due
    assert check_orphans(alias) == "ok: no job is due (and no worker is live)"
    registration.register(alias, name="w1", queues=None, concurrency=1, kinds=["tests.noop"])
    assert check_orphans(alias) == "ok: no job is due"
    Noop(n=1).enqueue(using=alias)
    assert check_orphans(alias) == (
        "ok: every due job (1) has a live worker that can run it (1 live worker)"
    )


# ---------------------------------------------------------------- a worker's start


def test_a_burst_worker_warns_at_start_of_due_jobs_no_live_worker_can_run(
    alias: str, workers: Workers
) -> None:
    waiting(alias, "shop.SendMail", jobs=2)  # a kind no worker knows
    waiting(alias, "tests.noop", queue="elsewhere")  # known, but in a queue it does not serve
    result = workers.burst(alias, "--queues", "default")
    log = result.stderr
    assert "2 due jobs of kind 'shop.SendMail' wait in queue default (the oldest for" in log, log
    assert "no live worker has a task of that kind" in log
    assert "1 due job of kind 'tests.noop' waits in queue elsewhere" in log
    assert "a live worker knows the kind but none serves its queue" in log
    # A burst worker is gone before a second look: it does not promise one.
    elsewhere = next(line for line in log.splitlines() if "queue elsewhere" in line)
    assert "said again" not in elsewhere
    assert Job.objects.using(alias).filter(state="ready").count() == 3  # nothing it could run


def test_a_burst_worker_with_nothing_orphaned_says_nothing_of_it(
    alias: str, workers: Workers
) -> None:
    Noop(n=1).enqueue(using=alias)
    result = workers.burst(alias)
    assert "no live worker can run" not in result.stderr
    assert Job.objects.using(alias).get().state == "completed"


# ---------------------------------------------------------------- before `migrate`


@pytest.fixture
def unmigrated(alias: str) -> Iterator[str]:
    """`alias` with venturi's migrations rolled back; whole again after the test."""
    call_command("migrate", "django_venturi", "zero", database=alias, verbosity=0)
    try:
        yield alias
    finally:
        call_command("migrate", database=alias, verbosity=0)
        assert unapplied_migrations(alias) == []


def test_a_database_check_says_venturis_migrations_are_not_applied(unmigrated: str) -> None:
    missing = unapplied_migrations(unmigrated)
    with override_settings(VENTURI={"DATABASE": unmigrated}):
        messages = [m for m in run_checks(databases=[unmigrated]) if m.id == "venturi.W032"]
        assert [m for m in run_checks() if m.id == "venturi.W032"] == []  # no --database
    [message] = messages
    assert f"database {unmigrated!r} has none of django_venturi's migrations applied" in (
        message.msg
    )
    assert f"({missing[0]} to {missing[-1]})" in message.msg
    assert "manage.py migrate" in (message.hint or "")


def test_check_database_reports_it_and_migrate_does_not() -> None:
    call_command("migrate", "django_venturi", "zero", database="default", verbosity=0)
    try:
        check = django_command("check", "--database", "default")
        assert check.returncode == 0, check.stderr
        said = check.stdout + check.stderr
        assert "venturi.W032" in said and "0001_initial to " in said
        assert "Run 'manage.py migrate'" in said
        migrate = django_command("migrate", "django_venturi")
        assert migrate.returncode == 0, migrate.stderr
        # `migrate` runs database checks too, and is about to apply the migrations.
        assert "venturi.W032" not in migrate.stdout + migrate.stderr
        assert "Applying django_venturi.0001_initial" in migrate.stdout
        assert unapplied_migrations("default") == []
    finally:
        call_command("migrate", database="default", verbosity=0)


def test_enqueue_before_migrate_says_to_run_migrate(unmigrated: str) -> None:
    with pytest.raises(DatabaseError) as raised:
        Noop(n=1).enqueue(using=unmigrated)
    message = str(raised.value)
    assert "django_venturi_job" in message  # the database's own words come first
    assert f"django_venturi's migrations are not applied on database {unmigrated!r}" in message
    assert "Run 'manage.py migrate'" in message
    assert f"manage.py check --database {unmigrated}" in message
    # The same class as the database's error, so code that catches it still does.
    assert isinstance(raised.value.__cause__, type(raised.value))
    if connections[unmigrated].vendor == "postgresql":
        assert isinstance(raised.value, ProgrammingError)


@pytest.mark.usefixtures("unmigrated")
@pytest.mark.parametrize("alias", ["default"])
def test_a_django_tasks_enqueue_before_migrate_says_to_run_migrate() -> None:
    available = [framework.name for framework in frameworks.available()]
    if not available:
        pytest.skip("neither django.tasks nor the django-tasks backport is installed")
    tasks = importlib.import_module(TASK_MODULES[available[0]])
    with pytest.raises(DatabaseError, match=r"migrations are not applied on database 'default'"):
        tasks.add.enqueue(2, 3)


def test_only_a_missing_table_of_venturis_gets_the_hint(alias: str) -> None:
    def error_of(sql: str) -> DatabaseError:
        with (
            pytest.raises(DatabaseError) as raised,
            transaction.atomic(using=alias),
            connections[alias].cursor() as cursor,
        ):
            cursor.execute(sql)
        return raised.value

    assert missing_tables.explained(alias, error_of("SELECT * FROM someone_elses_table")) is None
    assert (
        missing_tables.explained(alias, error_of("SELECT no_such_column FROM django_venturi_job"))
        is None
    )
    assert (
        missing_tables.explained(alias, error_of("SELECT * FROM django_venturi_nope")) is not None
    )
