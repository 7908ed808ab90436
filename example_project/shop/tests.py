"""The shop's own tests: how a project tests its venturi tasks with `django_venturi.testing`.

Run them with `python -m pytest example_project/shop/tests.py --ds=example_project.settings`
(pytest-django); the main suite runs them too (tests/test_example_project.py).
"""

from __future__ import annotations

import pytest

from django_venturi.testing import (
    VenturiQueue,
    assert_enqueued,
    drain,
    eager,
    venturi_queue,  # noqa: F401 - the fixture (or let the installed pytest plugin provide it)
)
from example_project.shop.models import Signup
from example_project.shop.signups import sign_up
from example_project.shop.tasks import (
    ImportContacts,
    PingWebhook,
    SendEmail,
    SignupReport,
    SyncToCrm,
)


def test_signing_up_enqueues_the_welcome_email(db: None) -> None:
    signup, _ = sign_up("ada@example.com")
    assert_enqueued(SendEmail, to="ada@example.com", signup_id=signup.pk, count=1)
    signup.refresh_from_db()
    assert signup.welcome_sent_at is None  # enqueued, not sent: no worker ran


def test_the_welcome_email_is_sent_when_the_queue_drains(db: None) -> None:
    signup, _ = sign_up("grace@example.com")
    ran = drain()
    assert [(r.kind, r.outcome) for r in ran] == [("shop.send_email", "completed")]
    signup.refresh_from_db()
    assert signup.welcome_sent_at is not None


def test_eager_mode_sends_at_once(db: None) -> None:
    with eager():
        signup, job = sign_up("linus@example.com")
    assert job.state == "completed"
    assert Signup.objects.get(pk=signup.pk).welcome_sent_at is not None


def test_retries_and_give_up(db: None) -> None:
    SyncToCrm(customer="acme", flaky_runs=2).enqueue()
    PingWebhook(url="https://example.com/hook").enqueue()
    outcomes = [(r.kind, r.outcome) for r in drain()]
    assert outcomes.count(("shop.sync_to_crm", "retry")) == 2
    assert ("shop.sync_to_crm", "completed") in outcomes
    assert outcomes.count(("shop.ping_webhook", "retry")) == 2
    assert ("shop.ping_webhook", "failed") in outcomes


def test_a_paused_import_resumes_until_done(venturi_queue: VenturiQueue) -> None:  # noqa: F811
    job = ImportContacts(source="contacts.csv", rows=50, batch=20).enqueue()
    assert [r.outcome for r in venturi_queue.drain()] == ["paused", "paused", "completed"]
    job.refresh_from_db()
    assert job.state == "completed"
    assert job.progress["done"] == 50 and job.progress["total"] == 50


def test_the_nightly_report_counts_signups(db: None) -> None:
    sign_up("ada@example.com")
    job = SignupReport(days=1).enqueue()  # what the scheduler does at 03:00
    assert [r.outcome for r in drain([SignupReport])] == ["completed"]
    job.refresh_from_db()
    assert job.progress["done"] == 1


@pytest.mark.parametrize("email", ["a@example.com", "b@example.com"])
def test_each_test_starts_with_an_empty_queue(db: None, email: str) -> None:
    sign_up(email)
    assert_enqueued(SendEmail, count=1)
