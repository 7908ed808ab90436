"""System checks for `settings.VENTURI` (run by `manage.py check` and at worker start)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import Error as DatabaseError
from django.db import connections

from django_venturi import tracing
from django_venturi.conf import (
    DEFAULTS,
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_DURATION,
    MAX_IDENTIFIER_BYTES,
    MAX_POLL_INTERVAL,
    MAX_QUEUE_WEIGHT,
    MAX_SHUTDOWN_TIMEOUT,
    notify_channels,
    venturi_settings,
)
from django_venturi.observe import telemetry
from django_venturi.store import statements

HINT = "See 'Settings' in the django-venturi guide."


def _error(key: str, message: str, id: str) -> Error:
    return Error(f"VENTURI[{key!r}] {message}", hint=HINT, obj="settings.VENTURI", id=id)


def _is_duration(value: Any, longest: timedelta = MAX_DURATION) -> bool:
    """A positive timedelta or number of seconds, at most `longest` (NaN and inf are not)."""
    if isinstance(value, timedelta):
        return timedelta(0) < value <= longest
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value <= longest.total_seconds()
    )


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


MAX_HISTORY_FLUSH_INTERVAL = timedelta(minutes=1)
"""The longest `HISTORY_FLUSH_INTERVAL`: a worker keeps its last minutes in memory only."""
DURATIONS: dict[str, timedelta] = {
    "DEFAULT_LEASE": MAX_DURATION,
    "HEARTBEAT_INTERVAL": MAX_DURATION,
    "RESCUE_INTERVAL": MAX_DURATION,
    "POLL_INTERVAL": MAX_POLL_INTERVAL,
    "SHUTDOWN_TIMEOUT": MAX_SHUTDOWN_TIMEOUT,
    "TIMEOUT_GRACE": MAX_DURATION,
    "PERIODIC_INTERVAL": MAX_DURATION,
    "HISTORY_FLUSH_INTERVAL": MAX_HISTORY_FLUSH_INTERVAL,
}
"""Each duration setting and its longest value."""
POSITIVE_INTS: dict[str, int] = {"CONCURRENCY": MAX_CONCURRENCY, "BATCH_SIZE": MAX_BATCH_SIZE}
"""Each whole-number setting and its largest value."""


def _longest(limit: timedelta) -> str:
    """`1 hour`, `365 days`: a limit as the checks' messages say it."""
    if limit % timedelta(days=1) == timedelta(0):
        days = limit.days
        return f"{days} day" + ("" if days == 1 else "s")
    hours = limit // timedelta(hours=1)
    return f"{hours} hour" + ("" if hours == 1 else "s")


@register(Tags.compatibility)
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Validate every key of `settings.VENTURI`, naming the bad one."""
    user = getattr(settings, "VENTURI", {})
    if not isinstance(user, dict):
        return [
            Error("VENTURI must be a dict", hint=HINT, obj="settings.VENTURI", id="venturi.E001")
        ]
    errors: list[CheckMessage] = []
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(
            _error(key, f"is not a setting (known: {', '.join(sorted(DEFAULTS))})", "venturi.E002")
        )
    checks: list[tuple[str, Callable[[Any], bool], str, str]] = [
        *(
            (
                key,
                lambda v, longest=longest: _is_duration(v, longest),
                f"must be a positive timedelta or number of seconds, at most {_longest(longest)}",
                "venturi.E003",
            )
            for key, longest in DURATIONS.items()
        ),
        *(
            (
                key,
                lambda v, largest=largest: _is_positive_int(v) and v <= largest,
                f"must be a whole number from 1 to {largest}",
                "venturi.E004",
            )
            for key, largest in POSITIVE_INTS.items()
        ),
        (
            "DATABASE",
            lambda v: v in settings.DATABASES,
            "must name an alias in DATABASES",
            "venturi.E005",
        ),
        (
            "LISTEN_DATABASE",
            lambda v: v is None or v in settings.DATABASES,
            "must be None or an alias in DATABASES",
            "venturi.E006",
        ),
        (
            "DEFAULT_MAX_ATTEMPTS",
            lambda v: v is None or _is_positive_int(v),
            "must be a positive int or None",
            "venturi.E007",
        ),
        (
            "STALL_TIMEOUT",
            lambda v: v is None or _is_duration(v, MAX_DURATION),
            f"must be None or a positive timedelta or number of seconds, at most "
            f"{_longest(MAX_DURATION)}",
            "venturi.E015",
        ),
        (
            "TASK_MODULES",
            lambda v: isinstance(v, list | tuple) and all(isinstance(m, str) for m in v),
            "must be a list of module paths",
            "venturi.E008",
        ),
        (
            "PRIORITY_WEIGHTS",
            _valid_weights,
            "must be three positive ints (HIGH, NORMAL, LOW)",
            "venturi.E009",
        ),
        (
            "QUEUE_WEIGHTS",
            _valid_queue_weights,
            f"must be a dict of queue names to whole numbers from 1 to {MAX_QUEUE_WEIGHT}",
            "venturi.E016",
        ),
        (
            "DEFAULT_QUEUE",
            _valid_queue,
            "must be a queue name (letters, digits, _ . : -)",
            "venturi.E010",
        ),
        (
            "PREPARED_STATEMENTS",
            lambda v: isinstance(v, bool),
            "must be True or False",
            "venturi.E020",
        ),
    ]
    for key, valid, message, check_id in checks:
        if key in user and not valid(user[key]):
            errors.append(_error(key, f"{message}, got {user[key]!r}", check_id))
    # Settings of periodic jobs, timeouts and testing (ids E041-E044).
    more: list[tuple[str, Callable[[Any], bool], str, str]] = [
        ("TESTING_EAGER", lambda v: isinstance(v, bool), "must be True or False", "venturi.E041"),
        (
            "PERIODIC_CATCH_UP",
            lambda v: v is None or _is_duration(v),
            "must be None or a positive timedelta or number of seconds",
            "venturi.E042",
        ),
        ("PERIODIC", lambda v: isinstance(v, list | tuple), "must be a list", "venturi.E043"),
    ]
    for key, valid, message, check_id in more:
        if key in user and not valid(user[key]):
            errors.append(_error(key, f"{message}, got {user[key]!r}", check_id))
    errors.extend(check_notify_channel(user))
    errors.extend(_check_lease_margin(user))
    errors.extend(check_retention(user))
    errors.extend(check_maintenance(user))
    errors.extend(check_payload_limit(user))
    if "HISTORY" in user and not isinstance(user["HISTORY"], bool):
        errors.append(
            _error("HISTORY", f"must be True or False, got {user['HISTORY']!r}", "venturi.E075")
        )
    if "METRICS" in user and not isinstance(user["METRICS"], bool):
        errors.append(
            _error("METRICS", f"must be True or False, got {user['METRICS']!r}", "venturi.E036")
        )
    elif user.get("METRICS") and not telemetry.available():
        errors.append(
            _error(
                "METRICS",
                "is True but OpenTelemetry is not installed: "
                "pip install 'django-venturi[metrics]' (and an SDK and exporter)",
                "venturi.E037",
            )
        )
    trace_url = tracing.trace_url_problem(user.get("TRACE_URL"))
    if trace_url is not None:
        errors.append(_error("TRACE_URL", trace_url, "venturi.E038"))
    errors.extend(check_sqlite_transaction_mode(user, settings.DATABASES))
    return errors


@register(Tags.database)
def check_listen_connection(
    app_configs: Sequence[AppConfig] | None = None,
    *,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """Warn when the listener's alias reaches PostgreSQL through a connection pooler.

    A database check: it connects, so Django runs it only for the databases it
    is given (`migrate`, `check --database`).
    """
    listen = venturi_settings.LISTEN_DATABASE
    if not databases or not {listen, venturi_settings.DATABASE} & set(databases):
        return []
    if listen not in connections:  # venturi.E006 says so
        return []
    try:
        pooled = statements.behind_pooler(listen)
    except DatabaseError:  # unreachable: nothing to tell yet
        return []
    if not pooled:
        return []
    return [
        CheckWarning(
            f"the listener's alias {listen!r} reaches PostgreSQL through a connection pooler: "
            "in transaction mode, LISTEN runs on whichever server connection is free and "
            "notifications are lost, so workers only poll",
            hint="Point VENTURI['LISTEN_DATABASE'] at an alias that connects to PostgreSQL "
            "directly (see 'PgBouncer' in the production docs).",
            obj="settings.VENTURI",
            id="venturi.W050",
        )
    ]


def check_sqlite_transaction_mode(
    user: dict[str, Any], databases: dict[str, Any]
) -> list[CheckMessage]:
    """Warn when the jobs database is SQLite without IMMEDIATE transactions (`venturi.W013`).

    A warning, not an error: `migrate`, `runserver` and every other command run
    these checks, and none of them needs what the setting protects. The worker
    does, and refuses to start on such a database (`venturi.E013`, same message).
    """
    alias = user.get("DATABASE", DEFAULTS["DATABASE"])
    if not isinstance(alias, str) or not isinstance(databases.get(alias), dict):
        return []  # venturi.E005 says so
    return sqlite_transaction_mode_errors(alias, databases[alias], for_worker=False)


def sqlite_transaction_mode_errors(
    alias: str, database: dict[str, Any], *, for_worker: bool
) -> list[CheckMessage]:
    """Claims on SQLite are only safe when every transaction takes the write lock first.

    `venturi_worker` runs this on its own `--database` (`for_worker`: an error,
    `venturi.E013`); `manage.py check` on `VENTURI["DATABASE"]` (a warning).
    """
    if "sqlite3" not in str(database.get("ENGINE", "")):
        return []
    mode = (database.get("OPTIONS") or {}).get("transaction_mode")
    if isinstance(mode, str) and mode.upper() == "IMMEDIATE":
        return []
    level, check_id = (Error, "venturi.E013") if for_worker else (CheckWarning, "venturi.W013")
    return [
        level(
            f"DATABASES[{alias!r}] is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE' "
            f"(got {mode!r}): concurrent claims could deadlock or fail with 'database is "
            "locked', so venturi_worker refuses to start on it",
            hint=f'Add "OPTIONS": {{"transaction_mode": "IMMEDIATE", "timeout": 20}} to '
            f"DATABASES[{alias!r}].",
            obj=f"settings.DATABASES[{alias!r}]",
            id=check_id,
        )
    ]


def _valid_weights(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 3
        and all(_is_positive_int(v) for v in value)
    )


def _valid_queue_weights(value: Any) -> bool:
    return isinstance(value, dict) and all(
        _valid_queue(queue) and _is_positive_int(weight) and weight <= MAX_QUEUE_WEIGHT
        for queue, weight in value.items()
    )


def _valid_queue(value: Any) -> bool:
    from django_venturi.registry import MAX_QUEUE_LENGTH, validate_name

    try:
        validate_name(value, field="queue", max_length=MAX_QUEUE_LENGTH)
    except ValueError:
        return False
    return True


def check_notify_channel(user: dict[str, Any]) -> list[CheckMessage]:
    """NOTIFY_CHANNEL and the channels venturi derives from it must each fit PostgreSQL's
    identifier limit, counted in bytes of UTF-8 as PostgreSQL counts it (`venturi.E011`).

    Past it, `pg_notify` fails (every enqueue, or every `cancel()`) and `LISTEN`
    truncates the name without an error, so a worker would wait on another channel.
    """
    if "NOTIFY_CHANNEL" not in user:
        return []
    value = user["NOTIFY_CHANNEL"]
    if not isinstance(value, str) or not value.isidentifier():
        return [
            _error(
                "NOTIFY_CHANNEL",
                f"must be an identifier (letters, digits and _), got {value!r}",
                "venturi.E011",
            )
        ]
    longest = max(notify_channels(value), key=lambda channel: len(channel.encode()))
    size = len(longest.encode())
    if size <= MAX_IDENTIFIER_BYTES:
        return []
    room = MAX_IDENTIFIER_BYTES - (size - len(value.encode()))
    return [
        _error(
            "NOTIFY_CHANNEL",
            f"is {len(value.encode())} bytes of UTF-8 ({value!r}): venturi also uses the "
            f"channel {longest!r} ({size} bytes), and PostgreSQL allows {MAX_IDENTIFIER_BYTES} "
            f"bytes, so the setting may have at most {room} bytes",
            "venturi.E011",
        )
    ]


def _check_lease_margin(user: dict[str, Any]) -> list[CheckMessage]:
    from django_venturi.conf import as_timedelta

    raw_lease = user.get("DEFAULT_LEASE", DEFAULTS["DEFAULT_LEASE"])
    raw_heartbeat = user.get("HEARTBEAT_INTERVAL", DEFAULTS["HEARTBEAT_INTERVAL"])
    if not (_is_duration(raw_lease) and _is_duration(raw_heartbeat)):
        return []  # reported above
    lease, heartbeat = as_timedelta(raw_lease), as_timedelta(raw_heartbeat)
    if heartbeat * 3 > lease:
        return [
            _error(
                "HEARTBEAT_INTERVAL",
                f"({heartbeat}) must be at most a third of DEFAULT_LEASE ({lease}), "
                "so that a lease survives two missed heartbeats",
                "venturi.E012",
            )
        ]
    return []


LARGEST_PAYLOAD_LIMIT = 268_435_455
"""The largest `MAX_PAYLOAD_BYTES`: PostgreSQL's jsonb holds no value over this many bytes."""


def check_payload_limit(user: dict[str, Any]) -> list[CheckMessage]:
    """MAX_PAYLOAD_BYTES is None or a whole number of bytes jsonb can hold (`venturi.E014`)."""
    if "MAX_PAYLOAD_BYTES" not in user:
        return []
    value = user["MAX_PAYLOAD_BYTES"]
    if value is None or (_is_positive_int(value) and value <= LARGEST_PAYLOAD_LIMIT):
        return []
    return [
        _error(
            "MAX_PAYLOAD_BYTES",
            f"must be None (no limit) or a whole number of bytes from 1 to "
            f"{LARGEST_PAYLOAD_LIMIT} (PostgreSQL's jsonb limit), got {value!r}",
            "venturi.E014",
        )
    ]


@register(Tags.compatibility)
def check_periodic(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every periodic schedule (decorators and `VENTURI["PERIODIC"]`) names a task that fits."""
    user = getattr(settings, "VENTURI", {})
    if isinstance(user, dict) and not isinstance(user.get("PERIODIC", []), list | tuple):
        return []  # reported by check_settings
    from django_venturi.periodic import errors

    return [
        Error(problem, hint=HINT, obj="settings.VENTURI['PERIODIC']", id="venturi.E044")
        for problem in errors()
    ]


def check_retention(user: dict[str, Any]) -> list[CheckMessage]:
    """RETENTION maps finished states to ages; a typo would silently keep jobs forever."""
    from django_venturi.conf import as_age
    from django_venturi.states import FINISHED_STATES

    value = user.get("RETENTION")
    if value is None:
        return []
    finished = ", ".join(state.value for state in FINISHED_STATES)
    if not isinstance(value, dict):
        return [
            _error("RETENTION", f"must be a dict of {{state: age}}, got {value!r}", "venturi.E035")
        ]
    errors: list[CheckMessage] = []
    for state, age in value.items():
        if state not in {s.value for s in FINISHED_STATES}:
            errors.append(
                _error(
                    "RETENTION",
                    f"has {state!r}: keys must be finished states ({finished})",
                    "venturi.E035",
                )
            )
            continue
        try:
            parsed = as_age(age)
        except ValueError as error:
            errors.append(_error("RETENTION", f"[{state!r}]: {error}", "venturi.E035"))
            continue
        if parsed <= timedelta(0):
            errors.append(
                _error(
                    "RETENTION", f"[{state!r}] must be a positive age, got {age!r}", "venturi.E035"
                )
            )
    return errors


MAINTENANCE_TASKS = ("REINDEX",)
SHORTEST_MAINTENANCE_INTERVAL = timedelta(hours=1)


def check_maintenance(user: dict[str, Any]) -> list[CheckMessage]:
    """MAINTENANCE maps maintenance tasks to how often workers run them."""
    from django_venturi.conf import as_age

    value = user.get("MAINTENANCE")
    if value is None:
        return []
    if not isinstance(value, dict):
        message = f'must be a dict like {{"REINDEX": "1d"}}, got {value!r}'
        return [_error("MAINTENANCE", message, "venturi.E045")]
    errors: list[CheckMessage] = []
    for task, every in value.items():
        if task not in MAINTENANCE_TASKS:
            message = f"has {task!r}: keys must be among {', '.join(MAINTENANCE_TASKS)}"
            errors.append(_error("MAINTENANCE", message, "venturi.E045"))
            continue
        try:
            parsed = as_age(every)
        except ValueError as error:
            errors.append(_error("MAINTENANCE", f"[{task!r}]: {error}", "venturi.E045"))
            continue
        if parsed < SHORTEST_MAINTENANCE_INTERVAL:
            message = f"[{task!r}] must be at least 1h between runs, got {every!r}"
            errors.append(_error("MAINTENANCE", message, "venturi.E045"))
    return errors


@register(Tags.compatibility)
def check_tasks_backends(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Validate the TASKS entries that name venturi's Django Tasks backend."""
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict) or not any(
        isinstance(entry, dict) and str(entry.get("BACKEND", "")).startswith("django_venturi.")
        for entry in tasks.values()
    ):
        return []  # the backend (and the Tasks frameworks) stay unimported
    from django_venturi.tasks_backend.backend import check_tasks_setting

    return check_tasks_setting()
