"""Settings and flags have bounds that say what is wrong: channel names are counted in
bytes as PostgreSQL counts them, and every numeric flag of every command is bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from django.test import override_settings

import django_venturi as venturi
from django_venturi.checks import check_settings
from django_venturi.conf import MAX_IDENTIFIER_BYTES, notify_channels, venturi_settings
from django_venturi.models import Job
from django_venturi.registry import registry
from django_venturi.store import registration, waiting_workers
from django_venturi.store.cancel import cancel_channel
from django_venturi.store.claim import ClaimRequest, claim
from django_venturi.store.pauses import pause_channel
from django_venturi.store.scheduling import TierClock
from django_venturi.worker.listener import Listener
from django_venturi.worker.process import Worker
from tests.conftest import django_command, wait_until
from tests.testapp.tasks import Noop

LONGEST_SUFFIX = max(len(channel) for channel in notify_channels(""))
"""The longest suffix venturi appends to NOTIFY_CHANNEL ('_cancel')."""
ROOM = MAX_IDENTIFIER_BYTES - LONGEST_SUFFIX
"""The most bytes NOTIFY_CHANNEL may have: 56."""


def channel_errors(channel: object) -> list[str]:
    with override_settings(VENTURI={"NOTIFY_CHANNEL": channel}):
        return [message.msg for message in check_settings() if message.id == "venturi.E011"]


# ---------------------------------------------------------------- NOTIFY_CHANNEL


@pytest.mark.parametrize(
    "channel",
    ["é" * 40, "é" * (ROOM // 2 + 1), "a" * 60, "a" * (ROOM + 1), "日本" * 10],
    ids=["80-bytes-of-e-acute", "58-bytes-of-e-acute", "60-ascii", "57-ascii", "cjk-60-bytes"],
)
def test_a_channel_too_long_in_bytes_for_a_derived_channel_is_refused(channel: str) -> None:
    [message] = channel_errors(channel)
    assert message.startswith("VENTURI['NOTIFY_CHANNEL'] is ")
    assert f"{len(channel.encode())} bytes of UTF-8" in message
    assert f"{channel}_cancel" in message  # the derived channel that does not fit
    assert f"at most {ROOM} bytes" in message


@pytest.mark.parametrize(
    "channel", ["a" * ROOM, "é" * (ROOM // 2), "venturi"], ids=["56-ascii", "56-bytes", "default"]
)
def test_a_channel_whose_derived_channels_fit_passes(channel: str) -> None:
    assert channel_errors(channel) == []
    assert max(len(name.encode()) for name in notify_channels(channel)) <= MAX_IDENTIFIER_BYTES


def test_a_channel_that_is_no_identifier_is_refused() -> None:
    [message] = channel_errors("bad-channel")
    assert "must be an identifier" in message and "'bad-channel'" in message
    assert len(channel_errors(7)) == 1


@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize("channel", ["é" * (ROOM // 2), "a" * ROOM], ids=["56-bytes", "56-ascii"])
def test_the_longest_channel_that_passes_carries_enqueue_cancel_and_pause(channel: str) -> None:
    """On PostgreSQL, with a listener as a worker runs it: nothing fails and nothing is
    truncated (a truncated LISTEN would hear nothing)."""
    heard: list[tuple[str, str]] = []
    lock = threading.Lock()

    def hear(name: str) -> Callable[[str | None], None]:
        def deliver(payload: str | None) -> None:
            if payload is not None:
                with lock:
                    heard.append((name, payload))

        return deliver

    with override_settings(VENTURI={"NOTIFY_CHANNEL": channel}):
        assert channel_errors(channel) == []
        names = {"jobs": channel, "cancel": cancel_channel(), "pause": pause_channel()}
        assert names["cancel"] == channel + "_cancel" and names["pause"] == channel + "_pause"
        listener = Listener(
            alias="default", channels={value: hear(key) for key, value in names.items()}
        )
        listener.start()
        try:
            assert listener.connected.wait(30), "the listener did not connect"
            # An enqueue NOTIFYs only while a worker of its queue waits for one.
            registration.register("default", name="waiting", queues=None, concurrency=1)
            assert waiting_workers.mark("default", "waiting", waiting=True)
            waiting_workers.forget()
            job = Noop(n=1).enqueue(queue="chan")
            wait_until(lambda: ("jobs", "chan") in heard, message="the enqueue's NOTIFY")
            kinds = registry.kinds()
            [claimed] = claim(
                "default",
                ClaimRequest(
                    worker="w1",
                    limit=1,
                    kinds=kinds,
                    leases=[timedelta(minutes=5)] * len(kinds),
                    queues=["chan"],
                    kind_prefix="tasks:",
                    prefix_lease=timedelta(minutes=5),
                ),
                TierClock((6, 3, 1)),
            )
            assert claimed.id == job.id
            venturi.cancel(job)  # running: its worker is told on the cancel channel
            wait_until(
                lambda: any(name == "cancel" and str(job.id) in p for name, p in heard),
                message="the cancel's NOTIFY",
            )
            assert Job.objects.get(pk=job.pk).cancel_requested_at is not None
            venturi.pause(queue="chan")
            wait_until(
                lambda: any(name == "pause" and "chan" in p for name, p in heard),
                message="the pause's NOTIFY",
            )
        finally:
            listener.stop()
    assert venturi_settings.NOTIFY_CHANNEL == "venturi"


# ---------------------------------------------------------------- other settings


@pytest.mark.parametrize(
    ("venturi", "check_id", "said"),
    [
        ({"CONCURRENCY": 10**25}, "venturi.E004", "from 1 to 1000, got 1000000000000000"),
        ({"CONCURRENCY": 1001}, "venturi.E004", "from 1 to 1000, got 1001"),
        ({"BATCH_SIZE": 10_001}, "venturi.E004", "from 1 to 10000, got 10001"),
        ({"POLL_INTERVAL": 1e308}, "venturi.E003", "at most 1 hour, got 1e+308"),
        ({"POLL_INTERVAL": float("inf")}, "venturi.E003", "at most 1 hour, got inf"),
        ({"POLL_INTERVAL": float("nan")}, "venturi.E003", "got nan"),
        ({"SHUTDOWN_TIMEOUT": timedelta(days=2)}, "venturi.E003", "at most 1 day"),
        ({"DEFAULT_LEASE": timedelta(days=400)}, "venturi.E003", "at most 365 days"),
        ({"RESCUE_INTERVAL": 10**400}, "venturi.E003", "at most 365 days"),
    ],
)
def test_numeric_settings_have_upper_bounds(venturi: object, check_id: str, said: str) -> None:
    with override_settings(VENTURI=venturi):
        [message] = check_settings()
    assert message.id == check_id
    assert said in message.msg
    key = next(iter(venturi))  # type: ignore[call-overload]
    assert message.msg.startswith(f"VENTURI[{key!r}] must be")


def test_the_bounds_themselves_pass() -> None:
    with override_settings(
        VENTURI={
            "CONCURRENCY": 1000,
            "BATCH_SIZE": 10_000,
            "POLL_INTERVAL": 3600,
            "SHUTDOWN_TIMEOUT": timedelta(days=1),
            "DEFAULT_LEASE": timedelta(days=365),
            "HEARTBEAT_INTERVAL": timedelta(days=100),
        }
    ):
        assert check_settings() == []


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("concurrency", 10**25, "Worker(concurrency=...) must be a whole number from 1 to 1000"),
        ("batch_size", 10**6, "Worker(batch_size=...) must be a whole number from 1 to 10000"),
        ("poll_interval", 1e308, "Worker(poll_interval=...) must be more than 0 seconds"),
        ("poll_interval", float("nan"), "Worker(poll_interval=...)"),
        ("shutdown_timeout", float("inf"), "Worker(shutdown_timeout=...) must be 0 seconds"),
        ("shutdown_timeout", -1, "Worker(shutdown_timeout=...)"),
    ],
)
def test_the_worker_class_refuses_what_it_cannot_work_with(
    option: str, value: object, said: str
) -> None:
    with pytest.raises(ValueError, match=r"^" + said.replace("(", r"\(").replace(")", r"\)")):
        Worker(**{option: value})  # type: ignore[arg-type]


# ---------------------------------------------------------------- flags

HUGE = "1" + "0" * 25
"""10**25 as typed."""
ENORMOUS = "9" * 5000
"""More digits than Python's int() reads by default."""

BAD_FLAGS = [
    ("venturi_worker", "--concurrency", HUGE, "must be at most 1000"),
    ("venturi_worker", "--concurrency", ENORMOUS, "must be at most 1000, got a number of 5000"),
    ("venturi_worker", "--concurrency", "1001", "must be at most 1000, got 1001"),
    ("venturi_worker", "--concurrency", "0", "must be at least 1, got 0"),
    ("venturi_worker", "--concurrency", "1.5", "'1.5' is not a whole number"),
    ("venturi_worker", "--batch-size", "10001", "must be at most 10000, got 10001"),
    ("venturi_worker", "--batch-size", "-3", "must be at least 1, got -3"),
    ("venturi_worker", "--poll-interval", "1e308", "must be at most 3600 seconds, got 1e308"),
    ("venturi_worker", "--poll-interval", "3600.5", "must be at most 3600 seconds"),
    ("venturi_worker", "--poll-interval", "nan", "must be a finite number of seconds, got nan"),
    ("venturi_worker", "--poll-interval", "inf", "must be a finite number of seconds, got inf"),
    ("venturi_worker", "--poll-interval", "1e309", "must be a finite number of seconds"),
    ("venturi_worker", "--poll-interval", "0", "must be more than 0 seconds, got 0"),
    ("venturi_worker", "--poll-interval", "soon", "'soon' is not a number of seconds"),
    ("venturi_worker", "--shutdown-timeout", "86401", "must be at most 86400 seconds"),
    ("venturi_worker", "--shutdown-timeout", "-inf", "must be a finite number of seconds"),
    ("venturi_worker", "--shutdown-timeout", "-1", "must be 0 or more seconds, got -1"),
    ("venturi_worker", "--kind-concurrency", f"tests.noop={HUGE}", "tests.noop=1000000"),
    ("venturi_worker", "--kind-concurrency", "tests.noop=0", "tests.noop=0: must be at least 1"),
    ("venturi_worker", "--health-port", "65536", "must be at most 65535, got 65536"),
    ("venturi_worker", "--health-port", "-1", "must be at least 0, got -1"),
    ("venturi_worker", "--health-port", "http", "'http' is not a whole number"),
    ("venturi_worker", "--health-host", " ", "' ' is not an address or host name"),
    ("venturi_stats", "--watch", "1e308", "must be at most 86400 seconds"),
    ("venturi_stats", "--watch", "nan", "must be a finite number of seconds"),
    ("venturi_stats", "--watch", "0", "must be more than 0 seconds"),
    ("venturi_stats", "--stale-after", "1e308", "must be at most 604800 seconds"),
    ("venturi_stats", "--stale-after", "inf", "must be a finite number of seconds"),
    ("venturi_cleanup", "--batch-size", HUGE, "must be at most 100000"),
    ("venturi_cleanup", "--batch-size", "0", "must be at least 1, got 0"),
]


@pytest.mark.parametrize(
    ("command", "flag", "value", "said"),
    BAD_FLAGS,
    ids=[f"{command}{flag}={value[:12]}" for command, flag, value, _ in BAD_FLAGS],
)
def test_each_numeric_flag_refuses_what_is_out_of_bounds(
    command: str, flag: str, value: str, said: str
) -> None:
    extra = ["--older-than", "7d"] if command == "venturi_cleanup" else []
    with pytest.raises(CommandError) as raised:
        call_command(command, f"{flag}={value}", *extra)
    message = str(raised.value)
    assert f"argument {flag}: " in message  # the flag is named
    assert said in message


@pytest.mark.parametrize(
    ("command", "args", "option", "parsed"),
    [
        ("venturi_worker", ["--concurrency", "1000"], "concurrency", 1000),
        ("venturi_worker", ["--batch-size", "10000"], "batch_size", 10_000),
        ("venturi_worker", ["--poll-interval", "3600"], "poll_interval", 3600.0),
        ("venturi_worker", ["--shutdown-timeout", "0"], "shutdown_timeout", 0.0),
        ("venturi_worker", ["--shutdown-timeout", "86400"], "shutdown_timeout", 86400.0),
        (
            "venturi_worker",
            ["--kind-concurrency", "tests.noop=1000"],
            "kind_concurrency",
            {"tests.noop": 1000},
        ),
        ("venturi_worker", ["--health-port", "65535"], "health_port", 65_535),
        ("venturi_worker", ["--health-port", "0"], "health_port", 0),
        ("venturi_worker", ["--health-host", "[::1]"], "health_host", "::1"),
        ("venturi_stats", ["--watch", "86400"], "watch", 86400.0),
        ("venturi_stats", ["--stale-after", "604800"], "stale_after", 604800.0),
        (
            "venturi_cleanup",
            ["--older-than", "7d", "--batch-size", "100000"],
            "batch_size",
            100_000,
        ),
    ],
)
def test_each_flag_accepts_its_bound(
    command: str, args: list[str], option: str, parsed: object
) -> None:
    parser = load_command_class("django_venturi", command).create_parser("manage.py", command)
    assert getattr(parser.parse_args(args), option) == parsed


@pytest.mark.django_db(transaction=True, databases=["default"])
@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--concurrency", HUGE, "argument --concurrency: must be at most 1000"),
        ("--poll-interval", "1e308", "argument --poll-interval: must be at most 3600 seconds"),
    ],
)
def test_the_worker_command_exits_with_a_usage_error_not_an_abort_or_a_traceback(
    flag: str, value: str, said: str
) -> None:
    """What the issue saw: exit 134 (an abort) for 10**25 and a traceback for 1e308."""
    result = django_command("venturi_worker", "--database", "default", "--burst", flag, value)
    assert result.returncode == 2, result.stderr
    assert said in result.stderr
    assert "Traceback" not in result.stderr
