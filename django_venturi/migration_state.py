"""Is the jobs database's schema as new as the code? A database system check.

A worker built from new code must not run against tables that lack the columns
it writes: it would fail on every claim, or worse, half-way through a batch of
verdicts. `venturi_worker` runs this check on its database before it starts and
refuses to start while venturi's migrations are behind; `manage.py check
--database default` reports the same as a warning (`venturi.W030`: `migrate` runs
database checks too and must not refuse to apply the missing migrations). A
database with none of them (a first install, where enqueueing fails with
"relation does not exist") gets its own warning, `venturi.W032`, except from
`migrate` itself, which is about to create the tables. Plain `manage.py check`
does not touch the database, as Django's own database checks do not.
"""

from __future__ import annotations

import pkgutil
import sys
from collections.abc import Iterable, Sequence
from importlib import import_module
from types import FrameType
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

from django_venturi.conf import venturi_settings

APP_LABEL = "django_venturi"
FIRST_MIGRATION = "0001_initial"
"""Every other migration of the app depends on it: unapplied, none is applied."""


@register(Tags.database)
def check_migrations_applied(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """Warn when the jobs database (VENTURI["DATABASE"]) misses any of venturi's migrations.

    A warning, not an error: `migrate` runs the database checks too, and must not
    refuse to apply the very migrations this check asks for. The worker treats the
    same finding as an error (`venturi.E030`) and does not start.
    """
    if databases is None or venturi_settings.DATABASE not in databases:
        return []
    return migration_errors(venturi_settings.DATABASE, upgrades_only=True)


def migration_errors(alias: str, *, upgrades_only: bool = False) -> list[CheckMessage]:
    """The check for one alias; `venturi_worker` runs it on its own `--database`.

    `upgrades_only`, for `migrate`'s database checks: a warning (`venturi.W030`)
    instead of the error, and nothing on a first install (no venturi migration
    applied yet), which the `migrate` running the check is about to do.
    """
    try:
        missing = unapplied_migrations(alias)
    except DatabaseError as error:
        # Unreachable now: the worker waits for the database like for any outage.
        return [
            Warning(
                f"could not read the migration state of database {alias!r}: {error}",
                obj=f"settings.DATABASES[{alias!r}]",
                id="venturi.W031",
            )
        ]
    if not missing:
        return []
    if upgrades_only and missing[0] == FIRST_MIGRATION:
        return [] if _run_by_migrate() else [_not_installed(alias, missing)]
    level, check_id = (Warning, "venturi.W030") if upgrades_only else (Error, "venturi.E030")
    return [
        level(
            f"database {alias!r} lacks {len(missing)} of django_venturi's migrations "
            f"({', '.join(missing)}): the code is newer than the job tables",
            hint=f"Run 'manage.py migrate django_venturi --database {alias}' before starting "
            "workers of this version.",
            obj=f"settings.DATABASES[{alias!r}]",
            id=check_id,
        )
    ]


def _not_installed(alias: str, missing: list[str]) -> CheckMessage:
    return Warning(
        f"database {alias!r} has none of django_venturi's migrations applied "
        f"({missing[0]} to {missing[-1]}): its tables do not exist, so enqueueing a job "
        "fails and no worker starts",
        hint=f"Run 'manage.py migrate' (or 'manage.py migrate django_venturi --database {alias}').",
        obj=f"settings.DATABASES[{alias!r}]",
        id="venturi.W032",
    )


def _run_by_migrate() -> bool:
    """Whether `migrate` (or a command built on it) runs the checks: it is about to apply
    the migrations, so telling its user to run it would only confuse.

    Django passes a check nothing that says which command runs it; the command's
    `execute` is on the stack, so look there (only at check time, never on a hot path).
    """
    from django.core.management.commands.migrate import Command as Migrate

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back
    return False


def unapplied_migrations(alias: str) -> list[str]:
    """Names of django_venturi's migrations not applied on `alias`, oldest first.

    Read from the migration files' names and the recorder's table: loading the
    migration graph imports every app's migrations, a tenth of a worker's start-up.
    The graph is loaded only when the project moved the app's migrations elsewhere.
    """
    names = _migration_names()
    if names is None:
        return _unapplied_in_graph(alias)
    recorder = MigrationRecorder(connections[alias])
    applied = {name for app, name in recorder.applied_migrations() if app == APP_LABEL}
    return [name for name in names if name not in applied]


def _migration_names() -> list[str] | None:
    """The app's own migrations, oldest first; None if MIGRATION_MODULES moved them."""
    if APP_LABEL in getattr(settings, "MIGRATION_MODULES", {}):
        return None
    package = import_module(f"{APP_LABEL}.migrations")
    return sorted(
        name
        for _, name, is_package in pkgutil.iter_modules(package.__path__)
        if not is_package and name[:4].isdigit()
    )


def _unapplied_in_graph(alias: str) -> list[str]:
    executor = MigrationExecutor(connections[alias])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
    return [
        migration.name
        for migration, backwards in executor.migration_plan(targets)
        if migration.app_label == APP_LABEL and not backwards
    ]
