"""`manage.py venturi_demo`: enqueue jobs of every outcome, run a burst worker, print tables.

1. on PostgreSQL, create the database `DATABASE_URL` names if the server lacks it,
   then `migrate` (so a fresh clone and a fresh server need nothing else);
2. delete the jobs and signups of earlier demo runs (`--keep` keeps them) and say
   how many of each;
3. enqueue `--count` jobs of each task in shop/tasks.py: the signups through
   `sign_up()` (the view's code: row and job in one `transaction.atomic()`),
   the rest in one `venturi.enqueue_many()` call;
4. run a worker in this process with `burst=True`: it exits once nothing is due;
5. print job counts by kind x state and journal entries by kind x outcome for
   the jobs of this run, and the journal of one job of each kind.

It exits non-zero if a job did not end the way its task is written to end.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from django.apps import apps
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError, connection, transaction
from django.db.models import Count

import django_venturi as venturi
from django_venturi.models import Job, JournalEntry
from django_venturi.worker import Worker
from example_project.shop.models import Signup
from example_project.shop.signups import sign_up
from example_project.shop.tasks import ChargeCard, ImportContacts, PingWebhook, SyncToCrm

DEMO_KINDS = (
    "shop.send_email",
    "shop.import_contacts",
    "shop.sync_to_crm",
    "shop.charge_card",
    "shop.ping_webhook",
)
DEMO_EMAIL_DOMAIN = "demo.example.com"

# How each kind's jobs end (state) and the journal of each of its jobs.
EXPECTED: dict[str, tuple[str, list[str]]] = {
    "shop.send_email": ("completed", ["completed"]),
    "shop.import_contacts": ("completed", ["paused", "paused", "completed"]),
    "shop.sync_to_crm": ("completed", ["retry", "retry", "completed"]),
    "shop.charge_card": ("failed", ["failed"]),
    "shop.ping_webhook": ("failed", ["retry", "retry", "failed"]),
}


class RolledBack(Exception):
    """Raised on purpose to roll a signup back."""


class Command(BaseCommand):
    help = "Enqueue demo jobs of every outcome, run a burst worker, print what happened."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=24, help="Jobs of each kind (24).")
        parser.add_argument(
            "--concurrency", type=int, default=4, help="Handler threads of the worker (4)."
        )
        parser.add_argument(
            "--keep", action="store_true", help="Keep the jobs and signups of earlier runs."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        count: int = options["count"]
        self.signup_ids: list[int] = []
        if count < 1:
            raise CommandError("--count must be at least 1")
        self.line(f"Database: {describe_database()}")
        if create_database_if_missing():
            self.line(f"Created the database {connection.settings_dict['NAME']!r}.")
        call_command("migrate", interactive=False, verbosity=0)
        self.line("Migrated.")
        if not options["keep"]:
            self.clear()

        ids = self.enqueue(count)
        self.work(ids, concurrency=options["concurrency"], verbose=options["verbosity"] >= 2)
        self.report(ids)
        self.verify(ids, count)

    # ------------------------------------------------------------ steps

    def clear(self) -> None:
        _, jobs = Job.objects.filter(kind__in=DEMO_KINDS).delete()
        _, signups = Signup.objects.filter(email__endswith="@" + DEMO_EMAIL_DOMAIN).delete()
        deleted = {**jobs, **signups}
        if any(deleted.values()):
            self.line(f"Deleted what earlier demo runs left: {describe_rows(deleted)}.")

    def enqueue(self, count: int) -> list[int]:
        ids: list[int] = []
        # Like POST /signup/: each signup and its SendEmail job in one transaction.
        for n in range(count):
            signup, job = sign_up(f"customer{n}@{DEMO_EMAIL_DOMAIN}")
            self.signup_ids.append(signup.pk)
            ids.append(job.pk)

        # A signup whose transaction rolls back after the enqueue leaves no job behind.
        before = Job.objects.filter(kind="shop.send_email").count()
        try:
            with transaction.atomic():
                sign_up(f"rolled-back@{DEMO_EMAIL_DOMAIN}")
                raise RolledBack
        except RolledBack:
            pass
        left_behind = Job.objects.filter(kind="shop.send_email").count() - before

        # Everything else in bulk: one INSERT for all of them, in one transaction.
        tasks: list[venturi.Task] = []
        for n in range(count):
            tasks += [
                ImportContacts(source=f"contacts-{n}.csv", rows=50, batch=20),
                SyncToCrm(customer=f"customer{n}", flaky_runs=2),
                ChargeCard(
                    order_ref=f"order-{n}", amount=Decimal("19.90"), card_token="tok_declined"
                ),
                PingWebhook(url=f"https://hooks.{DEMO_EMAIL_DOMAIN}/{n}"),
            ]
        with transaction.atomic():
            ids += [job.pk for job in venturi.enqueue_many(tasks)]

        self.line(
            f"Enqueued {len(ids)} jobs: {count} SendEmail through sign_up() "
            f"(one transaction each), {len(tasks)} others with venturi.enqueue_many()."
        )
        self.line(
            f"A signup rolled back after its enqueue left {counted(left_behind, 'job')} behind."
        )
        return ids

    def work(self, ids: Sequence[int], *, concurrency: int, verbose: bool) -> None:
        self.line(f"Running a burst worker (concurrency={concurrency}) until nothing is due...")
        # Half of these jobs fail on purpose; keep their log lines out of the way
        # unless asked for (-v 2).
        logger = logging.getLogger("django_venturi")
        level = logger.level
        if not verbose:
            logger.setLevel(logging.CRITICAL)
        started = time.monotonic()
        try:
            worker = Worker(burst=True, concurrency=concurrency)
            worker.run()
        finally:
            logger.setLevel(level)
        elapsed = time.monotonic() - started
        runs = JournalEntry.objects.filter(job_id__in=ids).count()
        self.line(f"Worker done: {runs} runs of {len(ids)} jobs in {elapsed:.1f} s.")

    def report(self, ids: Sequence[int]) -> None:
        jobs = Job.objects.filter(pk__in=ids)
        states = Counter(
            {
                (row["kind"], row["state"]): row["n"]
                for row in jobs.values("kind", "state").annotate(n=Count("id"))
            }
        )
        self.line("")
        self.line("Jobs by kind and state")
        self.table(states, columns=list(venturi.State.values))

        entries = JournalEntry.objects.filter(job_id__in=ids)
        outcomes = Counter(
            {
                (row["job__kind"], row["outcome"]): row["n"]
                for row in entries.values("job__kind", "outcome").annotate(n=Count("id"))
            }
        )
        core = ["completed", "paused", "retry", "failed"]
        extra = [o for o in venturi.JournalOutcome.values if o not in core]
        seen = {outcome for _, outcome in outcomes}
        self.line("")
        self.line("Journal entries (one per run) by kind and outcome")
        self.table(outcomes, columns=core + [o for o in extra if o in seen])

        self.line("")
        self.line("One job of each kind, run by run")
        for kind in DEMO_KINDS:
            job = jobs.filter(kind=kind).order_by("pk").first()
            if job is None:
                continue
            self.line(f"  {kind} #{job.pk}: {job.state}, payload {job.masked_payload()}")
            for entry in job.journal.order_by("id"):
                error = f"  {short_type(entry.error_type)}: {entry.error_message}"
                outcome = f"    run {entry.attempt}: {entry.outcome:<9}"
                self.line(outcome + error if entry.error_type or entry.error_message else outcome)
            if job.carry is not None:
                self.line(f"    last carry: {job.carry}")

        signups = Signup.objects.filter(pk__in=self.signup_ids)
        sent = signups.filter(welcome_sent_at__isnull=False).count()
        self.line("")
        self.line(f"Signups with their welcome email sent: {sent} of {signups.count()}.")
        self.line(
            "Browse the jobs and their journal in the admin: manage.py createsuperuser, "
            "manage.py runserver, then http://127.0.0.1:8000/admin/"
        )

    def verify(self, ids: Sequence[int], count: int) -> None:
        """Fail loudly if any job ended differently from what its task is written to do."""
        journals: dict[int, list[str]] = {}
        for job_id, outcome in (
            JournalEntry.objects.filter(job_id__in=ids)
            .order_by("id")
            .values_list("job_id", "outcome")
        ):
            journals.setdefault(job_id, []).append(outcome)
        wrong = []
        per_kind: Counter[str] = Counter()
        for job in Job.objects.filter(pk__in=ids).only("pk", "kind", "state"):
            per_kind[job.kind] += 1
            state, journal = EXPECTED[job.kind]
            if job.state != state or journals.get(job.pk, []) != journal:
                wrong.append(f"{job.kind} #{job.pk}: {job.state}, journal {journals.get(job.pk)}")
        missing = [kind for kind in DEMO_KINDS if per_kind[kind] != count]
        if wrong or missing:
            details = "\n".join(wrong[:10] + [f"{kind}: wrong job count" for kind in missing])
            raise CommandError(f"{counted(len(wrong), 'job')} did not end as expected:\n{details}")
        self.line("")
        self.line(self.style.SUCCESS("Every job ended as its task is written to end."))

    # ------------------------------------------------------------ output

    def line(self, text: str) -> None:
        self.stdout.write(text.rstrip())

    def table(self, counts: Counter[tuple[str, str]], *, columns: Iterable[str]) -> None:
        columns = list(columns)
        kinds = sorted({kind for kind, _ in counts}, key=kind_order)
        header = ["kind", *columns, "total"]
        rows = [
            [kind, *(str(counts[kind, c]) for c in columns), str(sum_kind(counts, kind))]
            for kind in kinds
        ]
        rows.append(
            [
                "total",
                *(str(sum(counts[k, c] for k in kinds)) for c in columns),
                str(sum(counts.values())),
            ]
        )
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

        def render(cells: list[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
            return "  ".join([first, *rest])

        self.line(render(header))
        self.line("  ".join("-" * width for width in widths))
        for row in rows[:-1]:
            self.line(render(row))
        self.line("  ".join("-" * width for width in widths))
        self.line(render(rows[-1]))


def sum_kind(counts: Counter[tuple[str, str]], kind: str) -> int:
    return sum(n for (k, _), n in counts.items() if k == kind)


def kind_order(kind: str) -> tuple[int, str]:
    return (DEMO_KINDS.index(kind) if kind in DEMO_KINDS else len(DEMO_KINDS), kind)


def short_type(error_type: str) -> str:
    return error_type.rpartition(".")[2]


def counted(count: int, noun: str) -> str:
    """'1 job', '2 jobs'."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def describe_rows(counts: dict[str, int]) -> str:
    """'10 jobs, 22 journal entries, 2 signups' from the counts `QuerySet.delete()` returns."""
    parts = []
    for label, count in counts.items():
        if count:
            meta = apps.get_model(label)._meta
            parts.append(f"{count} {meta.verbose_name if count == 1 else meta.verbose_name_plural}")
    return ", ".join(parts)


def create_database_if_missing() -> bool:
    """On PostgreSQL, create the database the settings name if the server lacks it.

    Return whether it was created. The demo's own database (for example
    `venturi_demo`, not the `postgres` maintenance database) then needs no
    `createdb` first. Django's `_nodb_cursor()` reaches the server without that
    database, the way its test runner creates test databases.
    """
    if connection.vendor != "postgresql":
        return False
    try:
        connection.ensure_connection()
    except OperationalError:  # missing, or the server is down: look before creating
        pass
    else:
        return False
    name = connection.settings_dict["NAME"]
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if cursor.fetchone() is not None:
            connection.ensure_connection()  # it exists: raise the first error again
            return False
        cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
    return True


def describe_database() -> str:
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"SQLite file {settings['NAME']} (set DATABASE_URL to use PostgreSQL)"
    where = f"{settings.get('HOST') or 'localhost'}:{settings.get('PORT') or 'default port'}"
    return f"{connection.vendor} database {settings['NAME']!r} on {where}"
