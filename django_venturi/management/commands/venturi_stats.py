"""`manage.py venturi_stats`: print a snapshot of the queue, once or every S seconds.

`--check-workers` is a health check instead: exit 0 if a worker on this host
(or `--host`) has a fresh heartbeat, 1 otherwise (a Kubernetes liveness probe, a
systemd `ExecStartPost=` check or a monitoring script). Orphan kinds (due jobs
no live worker can run) do not fail it, since restarting a worker would not
help; it names them on stderr. `--check-orphans` is the check that fails on them
(for monitoring, not for liveness).
"""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_venturi.management import flags
from django_venturi.observe.cap_stats import CapUse
from django_venturi.observe.fair_stats import FairUse
from django_venturi.observe.snapshot import Stats, stats
from django_venturi.observe.table_health import table_health
from django_venturi.store.orphan_kinds import OrphanKind

ORPHAN_CAUSES = (
    "its task is in a module venturi does not import (an app's tasks.py or "
    "VENTURI['TASK_MODULES'] are), the task was removed or renamed, the kind is a typo, "
    "or no worker serves its queue"
)


class Command(BaseCommand):
    help = (
        "Show ready, waiting and running jobs by kind and queue, queue latency, and the last "
        "hour's completed and failed jobs, retried and other runs, and the job table's health."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        parser.add_argument(
            "--watch",
            type=flags.watch_interval,
            default=None,
            metavar="S",
            help=f"Repeat every S s (more than 0, at most {flags.MAX_WATCH_SECONDS:g}).",
        )
        flags.add_database(parser)
        parser.add_argument(
            "--check-workers",
            action="store_true",
            help="Health check: exit 1 unless a worker on --host has a fresh heartbeat.",
        )
        parser.add_argument(
            "--check-orphans",
            action="store_true",
            help="Health check: exit 1 if due jobs wait that no live worker can run (none "
            "can when no worker is live).",
        )
        parser.add_argument(
            "--host",
            default=None,
            help="The host whose workers --check-workers looks at (default: this one; * for any).",
        )
        parser.add_argument(
            "--stale-after",
            type=flags.stale_after,
            default=None,
            metavar="S",
            help="A heartbeat older than S seconds is stale (more than 0, at most "
            f"{flags.MAX_STALE_AFTER_SECONDS:g}; default: 3 heartbeat intervals).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check_workers"]:
            self.check_workers(options)
            return
        if options["check_orphans"]:
            self.check_orphans(options)
            return
        while True:
            snapshot = stats(using=options["database"])
            health = table_health(using=options["database"])
            if options["json"]:
                figures = {**snapshot.as_dict(), "table_health": health.as_dict()}
                self.stdout.write(json.dumps(figures, sort_keys=True))
            else:
                self.stdout.write("\n".join([render(snapshot), *health.lines()]))
            if options["watch"] is None:
                return
            self.stdout.flush()
            time.sleep(options["watch"])

    def check_workers(self, options: dict[str, Any]) -> None:
        host = options["host"] or socket.gethostname()
        snapshot = stats(using=options["database"], stale_after=_stale_after(options))
        mine = [worker for worker in snapshot.workers if host in ("*", worker.host)]
        fresh = [worker.name for worker in mine if not worker.stale]
        stale = [worker.name for worker in mine if worker.stale]
        where = "any host" if host == "*" else host
        if not fresh:
            detail = f" (stale: {', '.join(stale)})" if stale else ""
            raise CommandError(f"no worker with a fresh heartbeat on {where}{detail}")
        self.stdout.write(
            f"ok: {len(fresh)} live worker(s) on {where}"
            + (f"; stale: {', '.join(stale)}" if stale else "")
        )
        if snapshot.orphan_kinds:
            self.stderr.write(f"warning: {orphans_line(snapshot.orphan_kinds)}")

    def check_orphans(self, options: dict[str, Any]) -> None:
        snapshot = stats(using=options["database"], stale_after=_stale_after(options))
        if snapshot.orphan_kinds:
            raise CommandError(orphans_line(snapshot.orphan_kinds))
        due = sum(snapshot.due.values())
        live = [worker for worker in snapshot.workers if not worker.stale]
        if due and not live:
            # No live worker at all: `orphan_kinds` is empty then (it compares live
            # workers), yet every due job waits.
            raise CommandError(no_live_worker_line(snapshot))
        if not due:
            self.stdout.write("ok: no job is due" + ("" if live else " (and no worker is live)"))
            return
        self.stdout.write(
            f"ok: every due job ({due}) has a live worker that can run it "
            f"({len(live)} live worker{'' if len(live) == 1 else 's'})"
        )


def _stale_after(options: dict[str, Any]) -> timedelta | None:
    seconds = options["stale_after"]
    return None if seconds is None else timedelta(seconds=seconds)


def no_live_worker_line(snapshot: Stats) -> str:
    """Due jobs wait and no worker is live: how many, where, and the stale workers if any."""
    due = sum(snapshot.due.values())
    queues = ", ".join(f"{jobs} in {queue}" for queue, jobs in sorted(snapshot.due.items()))
    stale = [worker.name for worker in snapshot.workers if worker.stale]
    detail = f"; stale: {', '.join(stale)}" if stale else ""
    return (
        f"{due} due job{'' if due == 1 else 's'} ({queues}) and no live worker to run "
        f"{'it' if due == 1 else 'them'}{detail}: start one with 'manage.py venturi_worker'"
    )


def orphans_line(orphans: list[OrphanKind]) -> str:
    """One line naming the orphan kinds and their likely causes."""
    named = ", ".join(f"{orphan.kind} ({orphan.jobs} in {orphan.queue})" for orphan in orphans)
    return f"due jobs that no live worker can run: {named}; causes: {ORPHAN_CAUSES}"


def runs(count: int, which: str) -> str:
    """'1 retried run', '4 retried runs'."""
    return f"{count} {which} run" + ("" if count == 1 else "s")


KEY_CHARS = 60
"""The most characters of a cap's key the text shows (a key may be a whole JSON object)."""


def shown_key(key: str) -> str:
    """A cap's key as the text shows it: quoted JSON when it would not show plainly
    (empty, edged with spaces, or holding a line break or another unprintable), and
    cut short past `KEY_CHARS`."""
    if len(key) > KEY_CHARS:
        key = key[: KEY_CHARS - 1] + "\u2026"
    return key if key and key.isprintable() and key.strip() == key else json.dumps(key)


def cap_line(use: CapUse) -> str:
    """One capped kind: its cap, the places held, and the due jobs waiting on it."""
    if use.key is None:
        at_cap = ", at the cap" if use.keys_at_cap else ""
        return (
            f"cap {use.kind}: {use.cap}; {use.running} running{at_cap}; {use.waiting} due waiting"
        )
    keys = "key" if use.keys_with_due == 1 else "keys"
    busiest = ", ".join(f"{shown_key(key)} {running}" for key, running in use.busiest)
    return (
        f"cap {use.kind}: {use.cap}; {use.running} running; {use.keys_with_due} {keys} with "
        f"due jobs, {use.keys_at_cap} at the cap"
        + (f" (busiest: {busiest})" if busiest else "")
        + f"; {use.waiting} due waiting, {use.waiting_on_cap} on the cap"
    )


def fair_line(use: FairUse) -> str:
    """One fair kind: its keys with due jobs and the busiest ones."""
    keys = "key" if use.keys_with_due == 1 else "keys"
    busiest = ", ".join(f"{shown_key(key)} {due}" for key, due in use.busiest)
    return (
        f"fair {use.kind} by {use.fair_by}: {use.keys_with_due} {keys} with due jobs"
        + (f" (busiest: {busiest})" if busiest else "")
        + f"; {use.waiting} due waiting"
    )


def render(snapshot: Stats) -> str:
    """The snapshot as a plain-text report."""
    lines = [
        f"venturi at {snapshot.taken_at:%Y-%m-%d %H:%M:%S %Z}: "
        f"{snapshot.ready} ready, {snapshot.waiting} waiting, {snapshot.running} running; "
        "last hour "
        f"{snapshot.completed_last_hour} completed, {snapshot.failed_last_hour} failed jobs "
        f"({snapshot.failure_rate:.1%} failed), {runs(snapshot.retried_last_hour, 'retried')}, "
        f"{runs(snapshot.other_last_hour, 'other')}",
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
    for item in snapshot.progress:
        total = "" if item.total is None else f" / {item.total}"
        lines.append(f"job {item.job_id} ({item.kind}): {item.done}{total} {item.note}".rstrip())
    for worker in snapshot.workers:
        lines.append(
            f"worker {worker.name} (pid {worker.pid}): {worker.running} running, "
            f"{worker.processed} processed, heartbeat "
            f"{(snapshot.taken_at - worker.heartbeat_at).total_seconds():.0f} s ago"
            + (" STALE" if worker.stale else "")
        )
    for pause in snapshot.pauses:
        lines.append(
            f"paused {pause.describe()} by {pause.paused_by} at "
            f"{pause.paused_at:%Y-%m-%d %H:%M:%S %Z}: no new claims"
        )
    for use in snapshot.rate_limits:
        keyed = f", {use.keys_at_limit} at the limit" if use.keys_at_limit else ""
        lines.append(
            f"rate limit {use.kind}: {use.limit}; {use.used} started in the window{keyed}; "
            f"{use.waiting} due waiting"
        )
    lines.extend(cap_line(use) for use in snapshot.caps)
    lines.extend(fair_line(use) for use in snapshot.fair)
    if snapshot.orphan_kinds:
        lines.append(f"due jobs that no live worker can run (causes: {ORPHAN_CAUSES}):")
    for orphan in snapshot.orphan_kinds:
        lines.append(
            f"  {orphan.kind} in queue {orphan.queue}: {orphan.jobs} due, oldest waiting "
            f"{orphan.oldest_due_age.total_seconds():.0f} s"
            + (
                f" (a live worker knows the kind; none serves {orphan.queue})"
                if orphan.known
                else ""
            )
        )
    return "\n".join(lines)
