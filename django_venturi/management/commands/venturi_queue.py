"""`manage.py venturi_queue pause|resume|list`: pause queues and kinds, resume them, list them.

    manage.py venturi_queue pause emails            # a queue (names are queues)
    manage.py venturi_queue pause --kind crm.sync   # a kind
    manage.py venturi_queue resume emails
    manage.py venturi_queue list [--json]

Paused means no new claims, on every worker; running jobs finish. A name no
registered task uses is paused all the same (jobs may be enqueued on any queue),
with a warning, since it is often a typo.
"""

from __future__ import annotations

import argparse
import difflib
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_venturi.management import flags
from django_venturi.management.commands.venturi_worker import default_queues
from django_venturi.payloads import text as stored_text
from django_venturi.registry import registry
from django_venturi.store.pauses import API, pause, paused, resume

ACTIONS = ("pause", "resume", "list")


def who(text: str) -> str:
    """`--by`: text the database can store, not blank."""
    problem = stored_text.problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    if not text.strip():
        raise argparse.ArgumentTypeError("must name who pauses")
    return text


class Command(BaseCommand):
    help = "Pause or resume queues and task kinds (no new claims on any worker), or list them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS, help="pause, resume or list.")
        parser.add_argument("queues", nargs="*", metavar="queue", help="Queues to act on.")
        parser.add_argument(
            "--kind",
            action="append",
            default=[],
            dest="kinds",
            metavar="KIND",
            help="A task kind to act on (repeat for several).",
        )
        parser.add_argument(
            "--by",
            type=who,
            default=API,
            help=f'Who pauses, as the stats show it (default "{API}").',
        )
        flags.add_database(parser)
        parser.add_argument("--json", action="store_true", help="list: print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        targets = [("queue", name) for name in options["queues"]] + [
            ("kind", name) for name in options["kinds"]
        ]
        if action == "list":
            if targets:
                raise CommandError("list takes no queue or --kind")
            self.list(options)
            return
        if not targets:
            raise CommandError(f"{action}: name at least one queue, or a --kind")
        for scope, name in targets:
            try:
                if action == "pause":
                    self.pause(scope, name, options)
                else:
                    self.resume(scope, name, options)
            except ValueError as error:
                raise CommandError(f"{action}: {error}") from None

    def pause(self, scope: str, name: str, options: dict[str, Any]) -> None:
        self.warn_if_unknown(scope, name)
        target = {scope: name}
        if pause(**target, by=options["by"], using=options["database"]):
            self.stdout.write(f"paused {scope} {name}: workers claim none of its jobs")
        else:
            self.stdout.write(f"{scope} {name} was paused already")

    def resume(self, scope: str, name: str, options: dict[str, Any]) -> None:
        if resume(**{scope: name}, using=options["database"]):
            self.stdout.write(f"resumed {scope} {name}")
        else:
            self.stdout.write(f"{scope} {name} was not paused")

    def list(self, options: dict[str, Any]) -> None:
        pauses = paused(using=options["database"])
        if options["json"]:
            self.stdout.write(json.dumps([item.as_dict() for item in pauses], indent=2))
            return
        if not pauses:
            self.stdout.write("nothing is paused")
            return
        self.stdout.write(f"{'scope':<6} {'name':<40} {'paused by':<20} paused at")
        for item in pauses:
            self.stdout.write(
                f"{item.scope:<6} {item.name:<40} {item.paused_by:<20} "
                f"{item.paused_at:%Y-%m-%d %H:%M:%S %Z}"
            )

    def warn_if_unknown(self, scope: str, name: str) -> None:
        known = sorted(default_queues()) if scope == "queue" else registry.kinds()
        if name in known:
            return
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        what = "uses queue" if scope == "queue" else "is registered under kind"
        self.stderr.write(
            f"warning: no registered task {what} {name!r}{hint}; paused all the same",
            self.style.WARNING,
        )
