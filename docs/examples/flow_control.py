"""Flow control: a global rate limit, a rate limit per account, and pausing a queue."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import django_venturi as venturi


# [rate limits]
@venturi.task(
    kind="docs.sync_contact",
    # The CRM allows 100 calls a minute for the whole project: every worker shares them.
    rate_limit=venturi.RateLimit(100, per=timedelta(minutes=1)),
)
@dataclasses.dataclass
class SyncContact(venturi.Task):
    contact_id: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@venturi.task(
    kind="docs.charge_account",
    # The payment API allows 5 calls a second per account: each account_id gets its own 5.
    rate_limit=venturi.RateLimit(5, per=timedelta(seconds=1), key="account_id"),
)
@dataclasses.dataclass
class ChargeAccount(venturi.Task):
    account_id: str
    amount_cents: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


# [rate limits end]


# [pausing]
def partner_outage_started() -> None:
    """The payment partner is down: stop charging until it is back, lose nothing."""
    venturi.pause(kind="docs.charge_account", by="on-call")


def partner_outage_over() -> None:
    venturi.resume(kind="docs.charge_account")


def what_is_paused() -> list[str]:
    return [f"{item.scope} {item.name} by {item.paused_by}" for item in venturi.paused()]


# [pausing end]
