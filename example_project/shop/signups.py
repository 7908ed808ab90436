"""Signing up: the row and its welcome-email job are written in one transaction."""

from __future__ import annotations

from django.db import transaction

from django_venturi.models import Job
from example_project.shop.models import Signup
from example_project.shop.tasks import SendEmail


def sign_up(email: str) -> tuple[Signup, Job]:
    """Save a signup and enqueue its welcome email, atomically.

    If anything in the block raises, neither the signup nor the job exists:
    no email for a signup that was rolled back, no signup without its email.
    """
    with transaction.atomic():
        signup = Signup.objects.create(email=email)
        job = SendEmail(signup_id=signup.pk, to=email, subject="Welcome to the shop").enqueue()
    return signup, job
