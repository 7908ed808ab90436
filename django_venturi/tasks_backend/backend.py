"""A backend for Django's Tasks framework: `@task` functions run on venturi workers.

    TASKS = {
        "default": {
            "BACKEND": "django_venturi.backend.VenturiBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 1, "DATABASE": "default"},
        }
    }

One class serves both frameworks, `django.tasks` (Django 6+) and the
`django_tasks` backport, even in one project: each framework's `task_backends`
builds its own instance from the same TASKS entry, and every job records the
framework of its Task, so results, contexts and signals come back as that
framework's types. Jobs are ordinary venturi rows (kind
`tasks:<module path of the function>`, payload the JSON arguments); workers run
them with the same `venturi_worker` command (`runner.py`).
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from django_venturi import tracing
from django_venturi.conf import venturi_settings
from django_venturi.registry import MAX_KIND_LENGTH, MAX_QUEUE_LENGTH, validate_name
from django_venturi.states import Priority, State
from django_venturi.store import missing_tables
from django_venturi.tasks_backend import envelope, frameworks, task_results
from django_venturi.tasks_backend.frameworks import Framework

BACKEND_PATH = "django_venturi.backend.VenturiBackend"
OPTIONS = {
    "MAX_ATTEMPTS": "runs a Task gets before it stays FAILED (default 1: no retry)",
    "DATABASE": "the database alias of the jobs (default VENTURI['DATABASE'])",
}
TASK_MIN_PRIORITY, TASK_MAX_PRIORITY = -100, 100


def tier_of(priority: int) -> Priority:
    """Django's -100..100 on venturi's tiers: above 0 HIGH, 0 NORMAL, below 0 LOW."""
    if priority > 0:
        return Priority.HIGH
    return Priority.NORMAL if priority == 0 else Priority.LOW


class VenturiBackend:
    """Django Tasks backend that writes venturi jobs; `venturi_worker` runs them.

    Not a subclass of either framework's `BaseTaskBackend`, but registered as a
    virtual subclass of both, so `isinstance` checks hold with either import.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        self.alias = alias
        # Bad values are not an error here: `manage.py check` reports them (venturi.E07x),
        # and the frameworks build every backend to run their own checks.
        queues = params.get("QUEUES", ["default"])
        self.queues = set(queues) if isinstance(queues, list | tuple | set) else set()
        options = params.get("OPTIONS", {})
        self.options = dict(options) if isinstance(options, dict) else {}
        self.framework = _framework_building_this() or frameworks.primary()
        """The framework whose `task_backends` built this instance: its `@task` makes
        its own `Task` objects (`task_class`). Jobs always answer in their own
        framework's types, whichever instance reads them."""

    @property
    def task_class(self) -> type:
        return self.framework.task_class

    @property
    def database(self) -> str:
        return str(self.options.get("DATABASE") or venturi_settings.DATABASE)

    @property
    def max_attempts(self) -> int:
        value = self.options.get("MAX_ATTEMPTS", 1)
        return value if isinstance(value, int) and value > 0 else 1

    # ------------------------------------------------------------ validating

    def validate_task(self, task: Any) -> None:
        """Refuse, with the framework's `InvalidTask`, what a worker could not run."""
        framework = frameworks.of_task(task)
        if framework is None:
            raise self.framework.invalid_task(
                f"{task!r} is not a Task of {' or '.join(_installed_names())}"
            )
        for problem in _problems(self, task):
            raise framework.invalid_task(problem)

    # ------------------------------------------------------------ enqueueing

    def enqueue(self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Write the job in the caller's current transaction; return a READY TaskResult."""
        self.validate_task(task)
        framework = frameworks.of_task(task)
        assert framework is not None
        payload = envelope.envelope(framework, task, args, kwargs)
        with missing_tables.explaining(self.database):  # before `migrate`: say so
            job_id, enqueued_at = _insert(
                self.database,
                kind=envelope.kind_of(task),
                queue=task.queue_name,
                priority=task.priority,
                payload=payload,
                run_at=task.run_after,
            )
        resolved = envelope.Resolved(framework, task, payload["args"], payload["kwargs"])
        facts = task_results.JobFacts(
            id=job_id,
            state=State.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            claimed_by="",
            result=None,
            runs=[],
        )
        result = task_results.task_result(framework, resolved, facts)
        framework.task_enqueued.send(type(self), task_result=result)
        return result

    async def aenqueue(self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    # ------------------------------------------------------------ results

    def get_result(self, result_id: str) -> Any:
        """The job's TaskResult, in the framework its Task came from."""
        from django_venturi.models import Job
        from django_venturi.registry import TASKS_KIND_PREFIX

        does_not_exist = frameworks.result_does_not_exist()
        job_id = job_id_of(result_id)
        if job_id is None:
            raise does_not_exist(f"no task result has the id {result_id!r}")
        job = (
            Job.objects.using(self.database)
            .filter(pk=job_id, kind__startswith=TASKS_KIND_PREFIX)
            .first()
        )
        if job is None:
            raise does_not_exist(f"no task result has the id {result_id!r}")
        try:
            resolved = envelope.resolve(job.kind, job.payload)
        except frameworks.UnrunnableTask as error:
            message = f"task result {result_id!r} names no loadable Task: {error}"
            raise does_not_exist(message) from None
        facts = task_results.JobFacts(
            id=job.pk,
            state=job.state,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            claimed_by=job.claimed_by,
            result=job.result,
            runs=task_results.runs_of(self.database, job.pk),
        )
        return task_results.task_result(resolved.framework, resolved, facts)

    async def aget_result(self, result_id: str) -> Any:
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)

    def check(self, **kwargs: Any) -> Iterable[CheckMessage]:
        """Nothing here: venturi's own checks validate every TASKS entry of this backend
        (`check_tasks_setting`), once, even when both frameworks ask each backend."""
        return []


def job_id_of(result_id: object) -> int | None:
    """The job id a TaskResult id names: exactly the decimal digits of a `TaskResult.id`.

    Only what `str(job.pk)` gives: no sign, spaces, underscores, leading zeros or
    non-ASCII digits, which `int()` would accept.
    """
    if not isinstance(result_id, str) or not (result_id.isascii() and result_id.isdigit()):
        return None
    if result_id != "0" and result_id.startswith("0"):
        return None
    return int(result_id)


def _framework_building_this() -> Framework | None:
    """The framework whose `task_backends` handler is constructing a backend right now."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        module = frame.f_globals.get("__name__")
        if module in frameworks.FRAMEWORK_MODULES:
            return frameworks.by_name(module)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _installed_names() -> list[str]:
    return [framework.name for framework in frameworks.available()]


def _problems(backend: VenturiBackend, task: Any) -> Iterable[str]:
    """What makes `task` one that workers could not run as enqueued.

    Where its module lives is not among them: outside installed apps, its jobs
    carry the producer's signature of it (`envelope.import_refusal`).
    """
    func = task.func
    if not inspect.isfunction(func) or "<locals>" in func.__qualname__ or "." in func.__qualname__:
        yield "Task function must be defined at a module level."
        return
    kind = envelope.kind_of(task)
    if len(kind) > MAX_KIND_LENGTH:
        yield f"the module path {task.module_path!r} is too long for a venturi kind"
    parameters = list(inspect.signature(func).parameters)
    if task.takes_context and (not parameters or parameters[0] != "context"):
        yield "Task takes context but does not have a first argument of 'context'."
    priority = task.priority
    if not isinstance(priority, int) or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY:
        yield (
            f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
            f"{TASK_MAX_PRIORITY}, got {priority!r}"
        )
    if settings.USE_TZ and task.run_after is not None and timezone.is_naive(task.run_after):
        yield "run_after must be an aware datetime."
    if backend.queues and task.queue_name not in backend.queues:
        yield (
            f"Queue '{task.queue_name}' is not valid for backend "
            f"(TASKS[{backend.alias!r}]['QUEUES'] is {sorted(backend.queues)})."
        )
    try:
        validate_name(task.queue_name, field="queue_name", max_length=MAX_QUEUE_LENGTH)
    except ValueError as error:
        yield str(error)


_INSERT_SQL = """
    WITH inserted AS (
        INSERT INTO {table}
            (kind, queue, priority, rank, state, payload, trace_context, attempt,
             failures, run_at, enqueued_at, claimed_by, last_error)
        VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, 0, 0,
                coalesce(%s::timestamptz, now()), now(), '', '')
        RETURNING id, queue, enqueued_at
    )
    SELECT id, enqueued_at, pg_notify(%s, queue) FROM inserted
"""


def _insert(
    alias: str, *, kind: str, queue: str, priority: int, payload: dict[str, Any], run_at: Any
) -> tuple[int, Any]:
    """Insert one ready job in the caller's transaction; return its id and enqueue time.

    The rank is the Django priority negated: within a tier, higher priorities
    are claimed first.
    """
    from django_venturi.models import Job

    connection = connections[alias]
    tier, rank = int(tier_of(priority)), -priority
    trace_context = tracing.current()
    if connection.vendor != "postgresql":
        now = timezone.now()
        job = Job.objects.using(alias).create(
            kind=kind,
            queue=queue,
            priority=tier,
            rank=rank,
            state=State.READY,
            payload=payload,
            trace_context=trace_context,
            run_at=run_at or now,
            enqueued_at=now,
        )
        return job.pk, now
    sql = _INSERT_SQL.format(table=connection.ops.quote_name(Job._meta.db_table))
    params = [
        kind,
        queue,
        tier,
        rank,
        State.READY.value,
        json.dumps(payload, allow_nan=False),
        None if trace_context is None else json.dumps(trace_context),
        run_at,
        venturi_settings.NOTIFY_CHANNEL,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    assert row is not None
    return int(row[0]), row[1]


# ---------------------------------------------------------------- system checks


def check_tasks_setting() -> list[CheckMessage]:
    """Validate every TASKS entry that names this backend (run by `manage.py check`)."""
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return []
    errors: list[CheckMessage] = []
    for alias, entry in tasks.items():
        if isinstance(entry, dict) and is_venturi_backend(entry.get("BACKEND")):
            errors.extend(_check_entry(alias, entry))
    return errors


def is_venturi_backend(path: object) -> bool:
    if path == BACKEND_PATH:
        return True
    if not isinstance(path, str) or not path.startswith("django_venturi."):
        return False
    try:
        return issubclass(import_string(path), VenturiBackend)
    except ImportError:
        return False


def _tasks_error(alias: str, message: str, id: str, hint: str = "") -> Error:
    return Error(
        f"TASKS[{alias!r}]{message}",
        hint=hint or "See 'Using Django's Tasks framework' in the django-venturi guide.",
        obj="settings.TASKS",
        id=id,
    )


def _check_entry(alias: str, entry: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    if not frameworks.available():
        errors.append(
            _tasks_error(
                alias,
                " uses VenturiBackend, but no Tasks framework is installed",
                "venturi.E070",
                hint="Use Django 6.0+, or `pip install django-venturi[tasks]` on Django 5.2.",
            )
        )
    queues = entry.get("QUEUES", ["default"])
    if not isinstance(queues, list | tuple | set) or not queues:
        errors.append(
            _tasks_error(
                alias, f"['QUEUES'] must be a non-empty list, got {queues!r}", "venturi.E071"
            )
        )
    else:
        for queue in queues:
            try:
                validate_name(queue, field="queue", max_length=MAX_QUEUE_LENGTH)
            except ValueError as error:
                errors.append(_tasks_error(alias, f"['QUEUES']: {error}", "venturi.E071"))
    options = entry.get("OPTIONS", {})
    if not isinstance(options, dict):
        errors.append(
            _tasks_error(alias, f"['OPTIONS'] must be a dict, got {options!r}", "venturi.E072")
        )
        return errors
    for key in sorted(set(options) - set(OPTIONS)):
        known = "; ".join(f"{name}: {meaning}" for name, meaning in OPTIONS.items())
        errors.append(
            _tasks_error(
                alias, f"['OPTIONS'][{key!r}] is not an option (known: {known})", "venturi.E072"
            )
        )
    attempts = options.get("MAX_ATTEMPTS", 1)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        errors.append(
            _tasks_error(
                alias,
                f"['OPTIONS']['MAX_ATTEMPTS'] must be a positive int, got {attempts!r}",
                "venturi.E073",
            )
        )
    database = options.get("DATABASE")
    if database is not None and database not in settings.DATABASES:
        errors.append(
            _tasks_error(
                alias,
                f"['OPTIONS']['DATABASE'] must name an alias in DATABASES, got {database!r}",
                "venturi.E074",
            )
        )
    return errors


for _framework in frameworks.available():
    _base: Any = _framework.base_backend  # an ABC: isinstance(VenturiBackend(...), _base)
    _base.register(VenturiBackend)
