"""The shop's venturi tasks, one for each way a job can end.

Each task is a dataclass: its fields are the job's payload (stored as typed
JSON), and `handle(ctx)` is what a worker runs. Django imports this module at
start-up (venturi looks for a `tasks` module in every installed app).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

import django_venturi as venturi
from example_project.shop.models import Signup

RETRY_AT_ONCE = venturi.Fibonacci(base=timedelta(0), cap=timedelta(0))
"""No wait between retries, so that a `--burst` worker sees the retry due at once.

Real tasks keep the default (1 s, 2 s, 3 s, 5 s, ... capped at an hour).
"""


@venturi.task(kind="shop.send_email")
@dataclasses.dataclass
class SendEmail(venturi.Task):
    """Completes: sends (pretends to send) a welcome email."""

    signup_id: int
    to: str
    subject: str

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        # A real task would call the mail provider here. It may run more than once
        # (a worker can die after sending), so make the side effect idempotent.
        Signup.objects.filter(pk=self.signup_id, welcome_sent_at__isnull=True).update(
            welcome_sent_at=timezone.now()
        )
        return venturi.Outcome.completed()


@dataclasses.dataclass
class ImportProgress:
    """The checkpoint of `ImportContacts`: where the next run starts."""

    next_row: int
    imported: int


@venturi.task(kind="shop.import_contacts", carry=ImportProgress)
@dataclasses.dataclass
class ImportContacts(venturi.Task):
    """Pauses: imports `rows` contacts `batch` at a time, checkpointing between batches."""

    source: str
    rows: int = 50
    batch: int = 20

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        progress = ctx.carry or ImportProgress(next_row=0, imported=0)
        end = min(progress.next_row + self.batch, self.rows)
        imported = progress.imported + (end - progress.next_row)  # "import" rows [next_row, end)
        ctx.progress(end, self.rows, note="contacts")  # shown in the admin and in stats()
        if end < self.rows:
            # Checkpoint and let other jobs run; the next run sees this as ctx.carry.
            # A pause does not count as a failed attempt.
            return venturi.Outcome.paused(ImportProgress(next_row=end, imported=imported))
        return venturi.Outcome.completed()


class CrmUnavailable(Exception):
    """The (imaginary) CRM timed out."""


@venturi.task(kind="shop.sync_to_crm", backoff=RETRY_AT_ONCE, max_attempts=5)
@dataclasses.dataclass
class SyncToCrm(venturi.Task):
    """Retries, then completes: the CRM fails the first `flaky_runs` attempts."""

    customer: str
    flaky_runs: int = 2

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        if ctx.attempt <= self.flaky_runs:
            # Any exception is a retryable failure: the job runs again after the backoff.
            raise CrmUnavailable(f"CRM timed out (attempt {ctx.attempt})")
        return venturi.Outcome.completed()


@venturi.task(kind="shop.charge_card")
@dataclasses.dataclass
class ChargeCard(venturi.Task):
    """Fails permanently when the card is declined: retrying would not help."""

    order_ref: str
    amount: Decimal
    card_token: str = venturi.secret()  # masked in the admin and in the demo's output

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        if self.card_token.startswith("tok_declined"):
            raise venturi.TaskError.permanent(f"card declined for {self.order_ref}")
        return venturi.Outcome.completed()


@venturi.task(kind="shop.ping_webhook", backoff=RETRY_AT_ONCE, max_attempts=3)
@dataclasses.dataclass
class PingWebhook(venturi.Task):
    """Gives up: the endpoint is always down, so after 3 failed attempts the job fails."""

    url: str

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        raise ConnectionError(f"{self.url} refused the connection")


@venturi.periodic("0 3 * * *", timezone="Europe/Paris", payload={"days": 1})
@venturi.task(kind="shop.signup_report")
@dataclasses.dataclass
class SignupReport(venturi.Task):
    """Periodic: every night at 03:00 Paris time, count the last `days` days' signups.

    Any number of workers may run: each night's tick is one job. The admin's
    "Periodic tasks" page shows its next and last run.
    """

    days: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        since = timezone.now() - timedelta(days=self.days)
        count = Signup.objects.filter(created_at__gte=since).count()
        ctx.progress(count, note="signups counted")
        return venturi.Outcome.completed()
