"""Settings: one `VENTURI = {...}` dict in Django settings, read lazily with defaults.

`settings.VENTURI` is read at attribute access, never at import, so tests can
override it with `override_settings`. `checks.py` validates every key.
"""

from __future__ import annotations

import math
import re
import reprlib
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "LISTEN_DATABASE": None,
    "TASK_MODULES": [],
    "DEFAULT_QUEUE": "default",
    "DEFAULT_MAX_ATTEMPTS": 20,
    "DEFAULT_LEASE": timedelta(minutes=5),
    "HEARTBEAT_INTERVAL": timedelta(seconds=10),
    "RESCUE_INTERVAL": timedelta(seconds=5),
    "CONCURRENCY": 10,
    "BATCH_SIZE": 500,
    "POLL_INTERVAL": timedelta(seconds=1),
    "SHUTDOWN_TIMEOUT": timedelta(seconds=30),
    "NOTIFY_CHANNEL": "venturi",
    "PRIORITY_WEIGHTS": (6, 3, 1),
    "QUEUE_WEIGHTS": {},
    "PREPARED_STATEMENTS": True,
    "TIMEOUT_GRACE": timedelta(seconds=10),
    "TESTING_EAGER": False,
    "PERIODIC": [],
    "PERIODIC_INTERVAL": timedelta(seconds=5),
    "PERIODIC_CATCH_UP": None,
    "RETENTION": None,
    "MAINTENANCE": None,
    "METRICS": False,
    "TRACE_URL": None,
    "MAX_PAYLOAD_BYTES": 1_000_000,
    "STALL_TIMEOUT": timedelta(seconds=60),
    "HISTORY": True,
    "HISTORY_FLUSH_INTERVAL": timedelta(seconds=5),
}

# Upper bounds of the settings and of the flags that override them. Past them a
# worker cannot work (threads, timeouts and waits overflow), so a check or the
# command refuses the value and names it, instead of a traceback or an abort.
MAX_CONCURRENCY = 1000
"""The most handler slots of a worker (`CONCURRENCY`, `--concurrency`, `--kind-concurrency`):
each is a thread, and a busy one holds a database connection."""
MAX_BATCH_SIZE = 10_000
"""The most jobs one claim takes (`BATCH_SIZE`, `--batch-size`)."""
MAX_QUEUE_WEIGHT = 1000
"""The largest weight of a queue in `QUEUE_WEIGHTS` (a share of 1000 to 1 is already
all of a worker's claims but one in a thousand)."""
MAX_POLL_INTERVAL = timedelta(hours=1)
"""The longest `POLL_INTERVAL` (`--poll-interval`): an idle worker looks at least this often."""
MAX_SHUTDOWN_TIMEOUT = timedelta(days=1)
"""The longest `SHUTDOWN_TIMEOUT` (`--shutdown-timeout`)."""
MAX_DURATION = timedelta(days=365)
"""The longest value of the other duration settings (leases, intervals, grace)."""

MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL's longest identifier, channel names included: NAMEDATALEN - 1 bytes of UTF-8.
`pg_notify` refuses a longer channel and `LISTEN` silently truncates it."""
CANCEL_CHANNEL_SUFFIX = "_cancel"
"""Appended to `NOTIFY_CHANNEL`: the channel of cancel requests (`store/cancel.py`)."""
PAUSE_CHANNEL_SUFFIX = "_pause"
"""Appended to `NOTIFY_CHANNEL`: the channel of pauses and resumes (`store/pauses.py`)."""


def notify_channels(base: str) -> list[str]:
    """Every channel venturi LISTENs and NOTIFYs on when `NOTIFY_CHANNEL` is `base`."""
    return [base, base + CANCEL_CHANNEL_SUFFIX, base + PAUSE_CHANNEL_SUFFIX]


class VenturiSettings:
    """Typed access to `settings.VENTURI`; each attribute falls back to its default.

    The dict is looked up once and kept until Django says the setting changed
    (`override_settings`, pytest-django's `settings`): a project without
    `VENTURI` would otherwise pay for a failed attribute lookup on Django's
    settings at every read, several times per enqueue.
    """

    _cached: dict[str, Any] | None = None

    @property
    def _user(self) -> dict[str, Any]:
        if self._cached is None:
            value = getattr(django_settings, "VENTURI", {})
            self._cached = value if isinstance(value, dict) else {}
        return self._cached

    def forget(self) -> None:
        """Read `settings.VENTURI` again at the next access."""
        self._cached = None

    def _get(self, name: str) -> Any:
        return self._user.get(name, DEFAULTS[name])

    @property
    def DATABASE(self) -> str:
        """The database alias where jobs live."""
        return str(self._get("DATABASE"))

    @property
    def LISTEN_DATABASE(self) -> str:
        """The alias the worker LISTENs on (a direct connection when DATABASE is pooled)."""
        value = self._get("LISTEN_DATABASE")
        return str(value) if value else self.DATABASE

    @property
    def TASK_MODULES(self) -> list[str]:
        """Modules imported at start-up besides each installed app's `tasks` module."""
        return list(self._get("TASK_MODULES"))

    @property
    def DEFAULT_QUEUE(self) -> str:
        """The queue of tasks that do not name one."""
        return str(self._get("DEFAULT_QUEUE"))

    @property
    def DEFAULT_MAX_ATTEMPTS(self) -> int | None:
        """How many failed runs a task gets when its decorator says `max_attempts=None`."""
        value = self._get("DEFAULT_MAX_ATTEMPTS")
        return None if value is None else int(value)

    @property
    def DEFAULT_LEASE(self) -> timedelta:
        """How long a claim lives without a heartbeat, for tasks that do not set `lease`."""
        return as_timedelta(self._get("DEFAULT_LEASE"))

    @property
    def HEARTBEAT_INTERVAL(self) -> timedelta:
        """How often a worker extends the leases of its running jobs."""
        return as_timedelta(self._get("HEARTBEAT_INTERVAL"))

    @property
    def RESCUE_INTERVAL(self) -> timedelta:
        """How often a worker looks for expired leases to recover."""
        return as_timedelta(self._get("RESCUE_INTERVAL"))

    @property
    def CONCURRENCY(self) -> int:
        """Handler slots per worker process (`--concurrency`)."""
        return int(self._get("CONCURRENCY"))

    @property
    def BATCH_SIZE(self) -> int:
        """The most jobs one claim statement takes."""
        return int(self._get("BATCH_SIZE"))

    @property
    def POLL_INTERVAL(self) -> timedelta:
        """How often an idle worker polls when no notification wakes it (`--poll-interval`)."""
        return as_timedelta(self._get("POLL_INTERVAL"))

    @property
    def SHUTDOWN_TIMEOUT(self) -> timedelta:
        """How long a stopping worker waits for running jobs (`--shutdown-timeout`)."""
        return as_timedelta(self._get("SHUTDOWN_TIMEOUT"))

    @property
    def NOTIFY_CHANNEL(self) -> str:
        """The PostgreSQL LISTEN/NOTIFY channel."""
        return str(self._get("NOTIFY_CHANNEL"))

    @property
    def PRIORITY_WEIGHTS(self) -> tuple[int, int, int]:
        """Claim slots given to HIGH, NORMAL and LOW when all three have work."""
        high, normal, low = self._get("PRIORITY_WEIGHTS")
        return int(high), int(normal), int(low)

    @property
    def QUEUE_WEIGHTS(self) -> dict[str, int]:
        """Queue -> its share of a worker's claims within a priority tier, among the
        queues with due jobs; a queue not listed has weight 1 (equal turns)."""
        return {str(queue): int(weight) for queue, weight in self._get("QUEUE_WEIGHTS").items()}

    @property
    def PREPARED_STATEMENTS(self) -> bool:
        """Prepare the claim, verdict and enqueue statements server-side (PostgreSQL)."""
        return bool(self._get("PREPARED_STATEMENTS"))

    @property
    def TIMEOUT_GRACE(self) -> timedelta:
        """How long a sync handler past its task's `timeout` may take to return."""
        return as_timedelta(self._get("TIMEOUT_GRACE"))

    @property
    def TESTING_EAGER(self) -> bool:
        """Run each job inline, in the enqueuing process, as it is enqueued (tests only)."""
        return bool(self._get("TESTING_EAGER"))

    @property
    def PERIODIC(self) -> list[dict[str, Any]]:
        """Periodic schedules declared in settings: dicts with task, cron, timezone, payload."""
        return list(self._get("PERIODIC"))

    @property
    def PERIODIC_INTERVAL(self) -> timedelta:
        """How often each worker looks for periodic ticks that came due."""
        return as_timedelta(self._get("PERIODIC_INTERVAL"))

    @property
    def PERIODIC_CATCH_UP(self) -> timedelta | None:
        """How late a missed tick may still be enqueued; None: the latest missed tick always."""
        value = self._get("PERIODIC_CATCH_UP")
        return None if value is None else as_timedelta(value)

    @property
    def RETENTION(self) -> dict[str, timedelta]:
        """Finished state -> how long its jobs are kept; workers delete older ones. {}: keep all."""
        value = self._get("RETENTION") or {}
        return {str(state): as_age(age) for state, age in value.items()}

    @property
    def MAINTENANCE(self) -> dict[str, timedelta]:
        """Maintenance task -> how often workers run it (`{"REINDEX": "1d"}`). {}: never."""
        value = self._get("MAINTENANCE") or {}
        return {str(task): as_age(every) for task, every in value.items()}

    @property
    def METRICS(self) -> bool:
        """Record OpenTelemetry metrics and spans (needs the `metrics` extra)."""
        return bool(self._get("METRICS"))

    @property
    def HISTORY(self) -> bool:
        """Whether workers write the history roll-ups (the stats page's charts)."""
        return bool(self._get("HISTORY"))

    @property
    def HISTORY_FLUSH_INTERVAL(self) -> timedelta:
        """How often a worker writes its history figures (what a crash may lose)."""
        return as_timedelta(self._get("HISTORY_FLUSH_INTERVAL"))

    @property
    def TRACE_URL(self) -> str | None:
        """Where the job page links a job's trace: a format string with `{trace_id}`."""
        value = self._get("TRACE_URL")
        return None if value is None else str(value)

    @property
    def STALL_TIMEOUT(self) -> timedelta | None:
        """How long a part of the worker may work without coming round before the worker
        stops extending its leases and exits non-zero (`worker/liveness.py`); None: never."""
        value = self._get("STALL_TIMEOUT")
        return None if value is None else as_timedelta(value)

    @property
    def MAX_PAYLOAD_BYTES(self) -> int | None:
        """The largest payload, carry or result, in bytes of compact JSON; None: no limit."""
        value = self._get("MAX_PAYLOAD_BYTES")
        return None if value is None else int(value)


AGE_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
MAX_AGE = timedelta(days=365_000)
"""The longest age `as_age` accepts, about 1,000 years: `now - age` must stay a time
Python and PostgreSQL can hold (Python's end at year 1; `9999999999d` overflowed)."""


def as_age(value: Any) -> timedelta:
    """Accept a timedelta, a number of seconds, or text like `30m`, `12h`, `7d`, `2w`
    (ASCII digits), at most `MAX_AGE` either way; raise ValueError for anything else."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*", value)
        if not match:
            raise ValueError(f"expected an age like 7d, 12h or 30m, got {reprlib.repr(value)}")
        seconds: float = float(match[1]) * AGE_UNIT_SECONDS[match[2]]  # inf past float's range
    elif isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and math.isnan(value):
            raise ValueError("expected a number of seconds, got nan")
        seconds = value
    else:
        raise ValueError(
            f"expected a timedelta, seconds or an age like 7d, got {reprlib.repr(value)}"
        )
    if abs(seconds) > MAX_AGE.total_seconds():
        raise ValueError(
            f"{reprlib.repr(value)} is too long an age: at most {MAX_AGE.days}d (about 1,000 years)"
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def as_timedelta(value: Any) -> timedelta:
    """Accept a timedelta or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


venturi_settings = VenturiSettings()


@receiver(setting_changed)
def _forget_changed_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == "VENTURI":
        venturi_settings.forget()
