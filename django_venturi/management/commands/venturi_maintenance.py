"""`manage.py venturi_maintenance reindex`: rebuild venturi's indexes concurrently (PostgreSQL)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_venturi.conf import venturi_settings
from django_venturi.management import flags
from django_venturi.store.maintenance import run_reindex
from django_venturi.store.reindex import MaintenanceRefused


class Command(BaseCommand):
    help = (
        "Maintenance of venturi's tables. `reindex`: drop the leftovers of interrupted "
        "concurrent rebuilds, then rebuild the job table's indexes (and the bloated ones "
        "of venturi's other tables) with REINDEX INDEX CONCURRENTLY. PostgreSQL only."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", choices=["reindex"], help="The maintenance task to run.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Say what would be done, do nothing."
        )
        flags.add_database(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or venturi_settings.DATABASE
        try:
            outcome = run_reindex(alias, dry_run=options["dry_run"], progress=self.stdout.write)
        except MaintenanceRefused as error:
            raise CommandError(str(error)) from None
        report = outcome.report
        if report is None:
            reason = outcome.skipped.value if outcome.skipped else "skipped"
            raise CommandError(f"nothing done on {alias!r}: {reason}; try again once it ends")
        if options["dry_run"]:
            for name in report.dropped:
                self.stdout.write(f"would drop {name} (left by an interrupted rebuild)")
            for index in report.rebuilt:
                self.stdout.write(f"would rebuild {index.name} ({index.before:,} bytes)")
            return
        self.stdout.write(
            f"reindex done on {alias!r}: {len(report.rebuilt)} indexes rebuilt, "
            f"{len(report.dropped)} leftovers dropped"
        )
