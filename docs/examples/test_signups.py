"""A project's own tests of its tasks, written with `django_venturi.testing` (the testing how-to).

In a project this is an ordinary pytest-django test module; it tests the code of
the quick start and the other how-to pages. Here tests/test_docs_testing_example.py
collects it into the suite. It uses nothing of venturi's test suite: only
pytest-django's fixtures and `venturi_queue`, the fixture of the pytest plugin
that installing django-venturi registers.
"""

from __future__ import annotations

# [imports]
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.mail import EmailMessage

from django_venturi.testing import VenturiQueue, assert_enqueued, drain, eager, enqueued
from docs.examples.enqueueing import SendReceipt, charge
from docs.examples.outcomes import ExportUsers, WelcomeWhenActive
from docs.examples.quickstart import SendWelcomeEmail, sign_up

# [imports end]


# [assert-enqueued]
def test_signing_up_enqueues_one_welcome_email(db: None, mailoutbox: list[EmailMessage]) -> None:
    user = sign_up("ada@example.com")
    assert_enqueued(SendWelcomeEmail, user_id=user.pk, count=1)
    assert mailoutbox == []  # enqueued, not run: no worker runs during a test


# [assert-enqueued end]


# [drain]
def test_the_welcome_email_goes_out_when_the_queue_drains(
    db: None, mailoutbox: list[EmailMessage]
) -> None:
    sign_up("grace@example.com")
    ran = drain()
    assert [(r.kind, r.outcome) for r in ran] == [("docs.send_welcome_email", "completed")]
    assert [message.to for message in mailoutbox] == [["grace@example.com"]]
    assert drain() == []  # nothing is left


def test_a_paused_export_runs_to_the_end(db: None) -> None:
    for name in ("a", "b", "c"):
        User.objects.create_user(name)
    ExportUsers(batch=2, batches_per_run=1).enqueue()
    # A pause is due again at once, so drain() runs the job until it completes.
    assert [r.outcome for r in drain()] == ["paused", "paused", "completed"]


# [drain end]


# [failures]
def test_failures_stay_on_the_job(db: None) -> None:
    idle = User.objects.create_user("idle", is_active=False)
    WelcomeWhenActive(user_id=idle.pk).enqueue()
    WelcomeWhenActive(user_id=999).enqueue()
    ran = drain([WelcomeWhenActive])  # this task's jobs only
    assert [(r.outcome, r.state) for r in ran] == [("retry", "ready"), ("failed", "failed")]
    assert "no user #999" in ran[1].error
    assert drain() == []  # the retry waits ten minutes: not due within the test


# [failures end]


# [eager]
def test_eager_runs_each_job_as_it_is_enqueued(db: None, mailoutbox: list[EmailMessage]) -> None:
    with eager():
        user = sign_up("linus@example.com")
    assert [message.to for message in mailoutbox] == [["linus@example.com"]]
    assert_enqueued(SendWelcomeEmail, user_id=user.pk, state="completed")


@pytest.fixture
def eager_jobs(settings: Any) -> None:
    """Every job of the test runs as it is enqueued."""
    settings.VENTURI = {**getattr(settings, "VENTURI", {}), "TESTING_EAGER": True}


def test_a_failure_in_eager_mode_stays_on_the_job(db: None, eager_jobs: None) -> None:
    job = WelcomeWhenActive(user_id=999).enqueue()  # raises nothing
    assert job.state == "failed" and "no user #999" in job.last_error


# [eager end]


# [on-commit]
def test_a_receipt_is_enqueued_when_the_charge_commits(
    db: None, django_capture_on_commit_callbacks: Any
) -> None:
    user = User.objects.create_user("payer")
    with django_capture_on_commit_callbacks(execute=True):
        charge(user.pk, 1500)
        assert enqueued(SendReceipt) == []  # not yet: the commit has not happened
    assert_enqueued(SendReceipt, user_id=user.pk, amount_cents=1500, count=1)


# [on-commit end]


# [fixture]
def test_with_the_fixture(venturi_queue: VenturiQueue, mailoutbox: list[EmailMessage]) -> None:
    user = sign_up("margaret@example.com")  # the fixture requests `db` itself
    venturi_queue.assert_enqueued(SendWelcomeEmail, user_id=user.pk)
    assert [r.outcome for r in venturi_queue.drain(queues=["default"])] == ["completed"]
    assert len(mailoutbox) == 1


# [fixture end]
