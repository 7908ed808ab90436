"""Settings: one `VENTURI = {...}` dict in Django settings, read lazily with defaults.

`settings.VENTURI` is read at attribute access, never at import, so tests can
override it with `override_settings`. `checks.py` validates every key.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings

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
    "BATCH_SIZE": 100,
    "POLL_INTERVAL": timedelta(seconds=1),
    "SHUTDOWN_TIMEOUT": timedelta(seconds=30),
    "NOTIFY_CHANNEL": "venturi",
    "PRIORITY_WEIGHTS": (6, 3, 1),
}


class VenturiSettings:
    """Typed access to `settings.VENTURI`; each attribute falls back to its default."""

    @property
    def _user(self) -> dict[str, Any]:
        value = getattr(django_settings, "VENTURI", {})
        return value if isinstance(value, dict) else {}

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


def as_timedelta(value: Any) -> timedelta:
    """Accept a timedelta or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


venturi_settings = VenturiSettings()
