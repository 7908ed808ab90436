"""The ways to enqueue: in a transaction, after the commit, many at once, from async code."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import transaction

import django_venturi as venturi
from django_venturi.models import Job


@venturi.task(kind="docs.send_receipt", queue="emails")
@dataclasses.dataclass
class SendReceipt(venturi.Task):
    user_id: int
    amount_cents: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


# [in-transaction]
def deactivate(user_id: int) -> Job:
    with transaction.atomic():
        User.objects.filter(pk=user_id).update(is_active=False)
        job = SendReceipt(user_id=user_id, amount_cents=0).enqueue()
        # An exception here rolls back the update and the job alike.
    return job


# [in-transaction end]


# [on-commit]
def charge(user_id: int, amount_cents: int) -> None:
    with transaction.atomic():
        User.objects.filter(pk=user_id).update(last_login=None)
        # Written only once the transaction commits; nothing if it rolls back.
        SendReceipt(user_id=user_id, amount_cents=amount_cents).enqueue_on_commit()


# [on-commit end]


# [many]
def send_all_receipts(user_ids: list[int]) -> list[Job]:
    with transaction.atomic():  # all or nothing: without it, each batch of 5,000 commits alone
        return venturi.enqueue_many(
            [SendReceipt(user_id=pk, amount_cents=100) for pk in user_ids],
            priority=venturi.Priority.LOW,
        )


# [many end]


# [options]
def remind_later(user_id: int) -> Job:
    return SendReceipt(user_id=user_id, amount_cents=0).enqueue(
        delay=timedelta(hours=1),  # or run_at=<an aware datetime>
        priority=venturi.Priority.HIGH,
        queue="reminders",
    )


# [options end]


# [async]
async def receipt_from_webhook(user_id: int, amount_cents: int) -> Job:
    return await SendReceipt(user_id=user_id, amount_cents=amount_cents).aenqueue()


# [async end]
