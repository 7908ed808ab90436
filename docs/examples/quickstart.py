"""The quick start: a task, and a view-level function that enqueues it with its data."""

from __future__ import annotations

# [task]
import dataclasses

from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import transaction

import django_venturi as venturi


@venturi.task(kind="docs.send_welcome_email", max_attempts=5)
@dataclasses.dataclass
class SendWelcomeEmail(venturi.Task):
    user_id: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        user = User.objects.get(pk=self.user_id)
        send_mail("Welcome", f"Hello {user.username}!", None, [user.email])  # raises: retried
        return venturi.Outcome.completed()


# [task end]


# [sign-up]
def sign_up(email: str) -> User:
    with transaction.atomic():
        user = User.objects.create_user(username=email, email=email)
        SendWelcomeEmail(user_id=user.pk).enqueue()
    # Both rows are committed here, or neither is.
    return user


# [sign-up end]
