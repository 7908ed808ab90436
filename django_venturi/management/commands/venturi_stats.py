"""`manage.py venturi_stats`: print a snapshot of the queue, once or every S seconds."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_venturi.management.commands.venturi_worker import positive_seconds
from django_venturi.snapshot import Stats, stats


class Command(BaseCommand):
    help = "Show ready and running jobs by kind and queue, queue latency and the last hour."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        parser.add_argument(
            "--watch", type=positive_seconds, default=None, metavar="S", help="Repeat every S s."
        )
        parser.add_argument("--database", default=None, help="Database alias holding the jobs.")

    def handle(self, *args: Any, **options: Any) -> None:
        while True:
            snapshot = stats(using=options["database"])
            if options["json"]:
                self.stdout.write(json.dumps(snapshot.as_dict(), sort_keys=True))
            else:
                self.stdout.write(render(snapshot))
            if options["watch"] is None:
                return
            self.stdout.flush()
            time.sleep(options["watch"])


def render(snapshot: Stats) -> str:
    """The snapshot as a plain-text report."""
    lines = [
        f"venturi at {snapshot.taken_at:%Y-%m-%d %H:%M:%S %Z}: "
        f"{snapshot.ready} ready, {snapshot.running} running; last hour "
        f"{snapshot.completed_last_hour} completed, {snapshot.failed_last_hour} failed "
        f"({snapshot.failure_rate:.1%})",
    ]
    if snapshot.live:
        lines.append(f"{'state':<8} {'queue':<20} {'kind':<40} {'jobs':>8}")
        for (state, kind, queue), jobs in sorted(snapshot.live.items()):
            lines.append(f"{state:<8} {queue:<20} {kind:<40} {jobs:>8}")
    for queue, age in sorted(snapshot.oldest_due_age.items()):
        lines.append(
            f"queue {queue}: {snapshot.due.get(queue, 0)} due, oldest waiting "
            f"{age.total_seconds():.1f} s"
        )
    return "\n".join(lines)
