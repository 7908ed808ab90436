"""`manage.py venturi_cleanup --older-than 7d`: delete old finished jobs in batches."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_venturi.conf import as_age
from django_venturi.management import flags
from django_venturi.states import FINISHED_STATES, State
from django_venturi.store.retention import DEFAULT_BATCH_SIZE, CleanupResult, cleanup


def age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w`."""
    try:
        return as_age(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def finished_states(text: str) -> list[State]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    allowed = {state.value for state in FINISHED_STATES}
    bad = [name for name in names if name not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"states must be among {', '.join(sorted(allowed))}, got {text!r}"
        )
    return [State(name) for name in names]


class Command(BaseCommand):
    help = "Delete finished jobs (and their journals) older than an age, in small batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=age, required=True, help="e.g. 7d, 12h, 30m.")
        parser.add_argument(
            "--state",
            type=finished_states,
            default=list(FINISHED_STATES),
            help="Comma-separated finished states (default: completed,failed,cancelled).",
        )
        parser.add_argument(
            "--batch-size",
            type=flags.cleanup_batch_size,
            default=DEFAULT_BATCH_SIZE,
            help=f"Jobs deleted per transaction, 1 to {flags.MAX_CLEANUP_BATCH_SIZE} "
            f"(default: {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count, delete nothing.")
        flags.add_database(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        on_terminal = sys.stdout.isatty()

        def progress(so_far: CleanupResult) -> None:
            message = f"{so_far.counts(', ')} deleted"
            if on_terminal:
                self.stdout.write(f"\r{message}", ending="")
            elif so_far.batches % 10 == 0:
                self.stdout.write(message)

        result = cleanup(
            older_than=options["older_than"],
            states=options["state"],
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
            using=options["database"],
            progress=progress,
        )
        if on_terminal and result.batches:
            self.stdout.write("")
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(
            f"{verb} {result.counts()}" + ("" if options["dry_run"] else f" {result.in_batches()}")
        )
