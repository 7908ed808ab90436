"""Periodic jobs: cron schedules declared on the task, or in settings.

Importing this module declares its schedules. The test suite keeps them out of
the other tests (tests/test_docs_examples.py) and out of the suite's own workers
(tests/settings.py does not list this module in TASK_MODULES).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.utils import timezone

import django_venturi as venturi


# [decorator]
@venturi.periodic("0 7 * * 1-5", timezone="Europe/Paris")  # 07:00 in Paris, Monday to Friday
@venturi.task(kind="docs.morning_report")
@dataclasses.dataclass
class MorningReport(venturi.Task):
    recipients: str = "managers"  # no payload= above: every field needs a default

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@venturi.periodic("*/10 * * * *", payload={"idle_days": 90})  # Django's TIME_ZONE
@venturi.task(kind="docs.deactivate_idle_users")
@dataclasses.dataclass
class DeactivateIdleUsers(venturi.Task):
    idle_days: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        cutoff = timezone.now() - timedelta(days=self.idle_days)
        User.objects.filter(is_active=True, last_login__lt=cutoff).update(is_active=False)
        return venturi.Outcome.completed()


# [decorator end]


# [settings-task]
@venturi.task(kind="docs.clear_sessions")  # no decorator: scheduled in settings
@dataclasses.dataclass
class ClearSessions(venturi.Task):
    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        Session.objects.filter(expire_date__lt=timezone.now()).delete()
        return venturi.Outcome.completed()


# [settings-task end]


# [settings]
VENTURI = {
    "PERIODIC": [
        {"task": "docs.clear_sessions", "cron": "30 2 * * *", "timezone": "Europe/Paris"},
        # Replaces the decorator's schedule of the same task.
        {
            "task": "docs.morning_report",
            "cron": "30 6 * * *",
            "timezone": "Europe/Paris",
            "payload": {"recipients": "everyone"},
        },
    ],
    # A tick missed by more than six hours (no worker was running) is skipped.
    "PERIODIC_CATCH_UP": timedelta(hours=6),
}
# [settings end]
