"""`manage.py check` names every bad VENTURI setting."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_venturi.checks import check_settings, check_sqlite_transaction_mode


def check_ids(venturi: object) -> list[str]:
    with override_settings(VENTURI=venturi):
        return [message.id or "" for message in check_settings()]


def test_the_default_settings_pass_every_system_check() -> None:
    assert check_ids({}) == []


@pytest.mark.parametrize(
    ("venturi", "check_id"),
    [
        ("not a dict", "venturi.E001"),
        ({"CONCURENCY": 4}, "venturi.E002"),
        ({"DEFAULT_LEASE": -1}, "venturi.E003"),
        ({"POLL_INTERVAL": "1s"}, "venturi.E003"),
        ({"CONCURRENCY": 0}, "venturi.E004"),
        ({"DATABASE": "nope"}, "venturi.E005"),
        ({"LISTEN_DATABASE": "nope"}, "venturi.E006"),
        ({"DEFAULT_MAX_ATTEMPTS": 0}, "venturi.E007"),
        ({"TASK_MODULES": "app.tasks"}, "venturi.E008"),
        ({"PRIORITY_WEIGHTS": (1, 0, 1)}, "venturi.E009"),
        ({"DEFAULT_QUEUE": "a b"}, "venturi.E010"),
        ({"NOTIFY_CHANNEL": "bad-channel"}, "venturi.E011"),
        ({"HEARTBEAT_INTERVAL": timedelta(minutes=3)}, "venturi.E012"),
        ({"PREPARED_STATEMENTS": "yes"}, "venturi.E020"),
    ],
)
def test_each_bad_value_has_its_check(venturi: object, check_id: str) -> None:
    assert check_ids(venturi) == [check_id]


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_the_message_names_the_setting_and_the_value() -> None:
    with (
        override_settings(VENTURI={"CONCURRENCY": "ten"}),
        pytest.raises(SystemCheckError) as raised,
    ):
        call_command("check")
    assert "VENTURI['CONCURRENCY'] must be a whole number from 1 to 1000, got 'ten'" in str(
        raised.value
    )


def test_sqlite_without_immediate_transactions_is_a_warning() -> None:
    """A warning for `check` and `migrate`; the worker refuses (tests/test_sqlite_setup.py)."""
    from django.conf import settings

    plain = {**settings.DATABASES["sqlite"], "OPTIONS": {}}
    errors = check_sqlite_transaction_mode({"DATABASE": "sqlite"}, {"sqlite": plain})
    assert [error.id for error in errors] == ["venturi.W013"]
    assert not errors[0].is_serious()
    assert "transaction_mode" in errors[0].msg
    assert check_ids({"DATABASE": "sqlite"}) == []
