"""Django's Tasks frameworks as venturi sees them: `django.tasks` (Django 6+) and the backport.

A project may use both at once (its own code on `django.tasks`, a library on the
`django_tasks` backport), so nothing here assumes one: each framework is loaded
on first use if it is installed, and every venturi job of a Task remembers which
framework its Task came from, so that results, contexts, errors and signals are
always that framework's own types.

This module also says how a job row reads back as a `TaskResult`, and how a
worker finds the Task a row names: by module path, and only if what it finds is
a real Task of the recorded framework. A worker imports the module if it is
inside an installed app, listed in `VENTURI["TASK_MODULES"]`, or signed: at
enqueue the producer signs the Task's module path with the project's
SECRET_KEY (`module_signature`), so the modules of a library that is not an
installed app (Wagtail's search enqueues `modelsearch.tasks`) are admitted
while a tampered row, which cannot sign, can never make a worker import an
arbitrary module or call anything that is not a declared Task.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from importlib import import_module
from typing import Any

from django.apps import apps
from django.core.signing import BadSignature, Signer
from django.dispatch import Signal
from django.utils.dateparse import parse_datetime

from django_venturi.payloads import text
from django_venturi.payloads.codec import UnstorableValue, int_problem, too_deep
from django_venturi.registry import TASKS_KIND_PREFIX
from django_venturi.states import FINISHED_STATES, JournalOutcome, State

FRAMEWORK_MODULES = ("django.tasks", "django_tasks")
"""Django's own framework first, then the backport."""


class UnrunnableTask(Exception):
    """A Tasks job names no Task that this process may run (a permanent failure)."""


class TaskCancelled(Exception):
    """The venturi job of this Task was cancelled (`venturi.cancel()` or the admin)."""


class WorkerLost(Exception):
    """The worker running this Task vanished; its lease expired and the job was recovered."""


@dataclasses.dataclass(frozen=True, slots=True)
class Framework:
    """One installed Tasks framework: the types and signals a backend deals in."""

    name: str
    """The module: `django.tasks` or `django_tasks`."""
    task_class: type
    result_class: type
    context_class: type
    error_class: type
    status: Any
    """Its `TaskResultStatus`."""
    invalid_task: type[Exception]
    result_does_not_exist: type[Exception]
    task_enqueued: Signal
    task_started: Signal
    task_finished: Signal
    base_backend: type
    task_backends: Any
    """Its `task_backends` handler (one backend instance per TASKS alias)."""

    def owns(self, task: object) -> bool:
        return isinstance(task, self.task_class)


def _load(name: str) -> Framework | None:
    try:
        package = import_module(name)
        base = import_module(f"{name}.base")
        exceptions = import_module(f"{name}.exceptions")
        signals = import_module(f"{name}.signals")
        backends = import_module(f"{name}.backends.base")
    except ImportError:
        return None
    invalid = getattr(exceptions, "InvalidTask", None) or exceptions.InvalidTaskError
    return Framework(
        name=name,
        task_class=base.Task,
        result_class=base.TaskResult,
        context_class=base.TaskContext,
        error_class=base.TaskError,
        status=base.TaskResultStatus,
        invalid_task=invalid,
        result_does_not_exist=exceptions.TaskResultDoesNotExist,
        task_enqueued=signals.task_enqueued,
        task_started=signals.task_started,
        task_finished=signals.task_finished,
        base_backend=backends.BaseTaskBackend,
        task_backends=package.task_backends,
    )


@functools.cache
def available() -> tuple[Framework, ...]:
    """The installed frameworks, Django's own first."""
    loaded = (_load(name) for name in FRAMEWORK_MODULES)
    return tuple(framework for framework in loaded if framework is not None)


def by_name(name: object) -> Framework:
    for framework in available():
        if framework.name == name:
            return framework
    raise UnrunnableTask(f"the Tasks framework {name!r} is not installed in this process")


def of_task(task: object) -> Framework | None:
    """The framework whose `Task` class `task` is an instance of, or None."""
    for framework in available():
        if framework.owns(task):
            return framework
    return None


def primary() -> Framework:
    """The framework to use when nothing says which: Django's own if installed."""
    frameworks = available()
    if not frameworks:
        raise ImportError(
            "django_venturi.backend needs Django's Tasks framework: Django 6.0+, "
            "or `pip install django-venturi[tasks]` (the django-tasks backport) on Django 5.2"
        )
    return frameworks[0]


@functools.cache
def result_does_not_exist() -> type[Exception]:
    """An exception that is every installed framework's `TaskResultDoesNotExist` at once.

    `get_result()` of an unknown id cannot tell which framework's code is asking,
    so it raises this: `except TaskResultDoesNotExist` works with either import.
    """
    bases = tuple(framework.result_does_not_exist for framework in available()) or (LookupError,)
    return type("TaskResultDoesNotExist", bases, {"__module__": __name__})


# ---------------------------------------------------------------- arguments and kinds


def kind_of(task: Any) -> str:
    """The venturi kind of a Task's jobs: the prefix, then the function's module path."""
    return f"{TASKS_KIND_PREFIX}{task.func.__module__}.{task.func.__qualname__}"


def module_is_allowed(module: str) -> bool:
    """Whether workers may import `module` to find a Task without a signature: inside
    an installed app, or listed (or under a module listed) in `VENTURI["TASK_MODULES"]`."""
    from django_venturi.conf import venturi_settings

    listed = venturi_settings.TASK_MODULES
    if any(module == name or module.startswith(f"{name}.") for name in listed):
        return True
    return apps.get_containing_app_config(module) is not None


MODULE_SIGNATURE_SALT = "django_venturi.task-module"
"""Keeps these signatures apart from every other use of SECRET_KEY."""


def module_signature(module: str) -> str:
    """Sign a Task's module path: this project's own code enqueued a Task of `module`.

    Made at enqueue with SECRET_KEY; a worker checks it with its SECRET_KEY and
    SECRET_KEY_FALLBACKS, so producers and workers must share the key.
    """
    return str(Signer(salt=MODULE_SIGNATURE_SALT).signature(module))


def import_refusal(module: str, signature: object) -> str | None:
    """Why a worker must not import `module` for a job carrying `signature`, or None.

    A job written before signatures (no `module_signature`) keeps the old rule:
    installed apps and `VENTURI["TASK_MODULES"]` only.
    """
    if module_is_allowed(module):
        return None
    outside = f"{module!r} is not inside an installed app or VENTURI['TASK_MODULES']"
    if signature is None:
        return f"{outside}, and the job carries no signature of it: not imported"
    if not isinstance(signature, str) or not _signed(module, signature):
        return (
            f"{outside}, and the job's signature of it is not valid (made for another "
            "module, or with a SECRET_KEY that is neither SECRET_KEY nor in "
            "SECRET_KEY_FALLBACKS here): not imported"
        )
    return None


def _signed(module: str, signature: str) -> bool:
    signer = Signer(salt=MODULE_SIGNATURE_SALT)
    try:
        signer.unsign(f"{module}{signer.sep}{signature}")
    except BadSignature:
        return False
    return True


def check_json(value: Any, where: str) -> Any:
    """Return Task arguments as plain JSON (tuples become lists), or raise naming what does
    not fit.

    Django requires Task arguments and return values to be JSON; venturi refuses
    anything that would not reach the task equal (non-str keys, NaN, other types) or
    that the database cannot store (NUL, surrogates: see `django_venturi.payloads.text`).
    UTF-8 bytes become text, as Django's own `TaskResult` makes them.
    """
    return _checked(value, where, _str_key)


def stored_result(value: Any) -> Any:
    """Return a Task's return value as it is stored, or raise naming what does not fit.

    As `check_json`, except that dict keys of the types JSON writes as text (int,
    float, bool, None) become that text, as a round trip through `json` makes them:
    `{1: "a"}` is stored and read back as `{"1": "a"}`, as Django's database-backed
    backends store it. NaN and infinities stay refused: PostgreSQL's jsonb holds none.
    """
    return _checked(value, "the return value", _json_key)


KeyRule = Callable[[object, str], str]
"""How dict keys become JSON keys: the key and where its dict is, to the key's text."""


def _checked(value: Any, where: str, key_rule: KeyRule) -> Any:
    try:
        return _check_json(value, where, key_rule)
    except RecursionError:
        raise too_deep(where) from None


def _check_json(value: Any, where: str, key_rule: KeyRule) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        problem = int_problem(value)
        if problem:
            raise UnstorableValue(where, problem)
        return value
    if isinstance(value, str):
        return _storable_text(value, where)
    if isinstance(value, bytes):
        try:
            return _storable_text(value.decode(), where)
        except UnicodeDecodeError:
            raise ValueError(f"{where} is bytes that are not UTF-8 text") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(
                f"{where} is {value!r}, which JSON cannot hold (nor can PostgreSQL's jsonb)"
            )
        return value
    if isinstance(value, Mapping):
        return _check_mapping(value, where, key_rule)
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [
            _check_json(item, f"{where}[{index}]", key_rule) for index, item in enumerate(value)
        ]
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which is not "
        "JSON-serialisable (Django Tasks take str, int, float, bool, None, list and dict)"
    )


def _check_mapping(value: Mapping[Any, Any], where: str, key_rule: KeyRule) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    original: dict[str, object] = {}
    for key, item in value.items():
        name = key_rule(key, where)
        problem = text.problem(name)
        if problem:
            raise UnstorableValue(f"{where}[{key!r}]", f"the key {problem}")
        if name in original:
            raise ValueError(
                f"{where} has the keys {original[name]!r} and {key!r}, which JSON writes "
                f"as one key {name!r}"
            )
        original[name] = key
        checked[name] = _check_json(item, f"{where}[{key!r}]", key_rule)
    return checked


def _str_key(key: object, where: str) -> str:
    if not isinstance(key, str):
        raise TypeError(
            f"{where} has the key {key!r} ({type(key).__name__}); JSON keys must be str"
        )
    return key


def _json_key(key: object, where: str) -> str:
    """The text `json.dumps` writes for the dict key `key` (it refuses other types)."""
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        problem = int_problem(key)
        if problem:
            raise UnstorableValue(f"{where}'s key", problem)
        return int.__repr__(key)
    if isinstance(key, float) and math.isfinite(key):
        return float.__repr__(key)
    raise TypeError(
        f"{where} has the key {key!r} ({type(key).__name__}); JSON keys must be str, "
        "or an int, a finite float, a bool or None (written as text)"
    )


def _storable_text(value: str, where: str) -> str:
    problem = text.problem(value)
    if problem:
        raise UnstorableValue(where, problem)
    return value


def envelope(
    framework: Framework, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The payload of a Tasks job: the framework, the Task's options and its arguments."""
    return {
        "framework": framework.name,
        "backend": task.backend,
        "priority": task.priority,
        "queue_name": task.queue_name,
        "run_after": None if task.run_after is None else task.run_after.isoformat(),
        "module_signature": module_signature(task.func.__module__),
        "args": check_json(list(args), "args"),
        "kwargs": check_json(dict(kwargs), "kwargs"),
    }


# ---------------------------------------------------------------- finding the Task of a row


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """The Task a Tasks job names, with the options it was enqueued with."""

    framework: Framework
    task: Any
    args: list[Any]
    kwargs: dict[str, Any]


def resolve(kind: str, payload: Any) -> Resolved:
    """Find the Task of a job row, or raise `UnrunnableTask` saying why (nothing is called)."""
    if not kind.startswith(TASKS_KIND_PREFIX):
        raise UnrunnableTask(f"{kind!r} is not a Django Tasks job")
    if not isinstance(payload, dict):
        raise UnrunnableTask("the stored payload is not a Tasks envelope (expected an object)")
    framework = by_name(payload.get("framework"))
    args, kwargs = payload.get("args"), payload.get("kwargs")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise UnrunnableTask("the stored payload has no args list and kwargs object")
    path = kind.removeprefix(TASKS_KIND_PREFIX)
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute.isidentifier():
        raise UnrunnableTask(f"{path!r} is not a module path")
    refusal = import_refusal(module_name, payload.get("module_signature"))
    if refusal:
        raise UnrunnableTask(refusal)
    try:
        module = import_module(module_name)
    except ImportError as error:
        raise UnrunnableTask(f"cannot import {module_name!r}: {error}") from None
    task = getattr(module, attribute, None)
    if not framework.owns(task):
        raise UnrunnableTask(
            f"{path} is a {type(task).__qualname__}, not a {framework.name} Task: not called"
        )
    return Resolved(framework, _as_enqueued(framework, task, payload), args, kwargs)


def _as_enqueued(framework: Framework, task: Any, payload: dict[str, Any]) -> Any:
    """The Task with the options it was enqueued with (`Task.using(...)`)."""
    run_after = payload.get("run_after")
    try:
        return task.using(
            priority=payload.get("priority"),
            queue_name=payload.get("queue_name"),
            run_after=parse_datetime(run_after) if isinstance(run_after, str) else None,
            backend=payload.get("backend"),
        )
    except (framework.invalid_task, TypeError, ValueError) as error:
        raise UnrunnableTask(f"{task.module_path}: {error}") from None
    except Exception as error:  # e.g. the backend alias is no longer in TASKS
        raise UnrunnableTask(f"{task.module_path}: {type(error).__name__}: {error}") from None


def is_async(task: Any) -> bool:
    return inspect.iscoroutinefunction(task.func)


# ---------------------------------------------------------------- rows as TaskResults


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """One execution of a job as its journal records it."""

    worker: str
    started_at: datetime | None
    outcome: str
    error_type: str
    error_message: str
    traceback: str


ERROR_OUTCOMES = frozenset(
    {
        JournalOutcome.RETRY,
        JournalOutcome.FAILED,
        JournalOutcome.TIMEOUT,
        JournalOutcome.LEASE_EXPIRED,
        JournalOutcome.CANCELLED,
    }
)
PSEUDO_ERROR_TYPES = {
    "django_venturi.LeaseExpired": f"{__name__}.WorkerLost",
}
"""Error types venturi writes that are not importable classes, and the class Django sees."""


def runs_of(alias: str, job_id: int) -> list[Run]:
    """The job's executions, oldest first (late results of lost claims left out)."""
    from django_venturi.models import JournalEntry

    rows = (
        JournalEntry.objects.using(alias)
        .filter(job_id=job_id)
        .exclude(outcome=JournalOutcome.DISCARDED)
        .order_by("id")
        .values_list("worker", "started_at", "outcome", "error_type", "error_message", "traceback")
    )
    return [Run(*row) for row in rows]


def status_of(framework: Framework, state: str) -> Any:
    status = framework.status
    if state == State.CANCELLED:
        # Neither framework has a cancelled status yet: FAILED ("unable to start")
        # is the closest, with a TaskCancelled error saying why.
        return getattr(status, "CANCELLED", status.FAILED)
    return {
        State.READY: status.READY,
        State.RUNNING: status.RUNNING,
        State.COMPLETED: status.SUCCESSFUL,
        State.FAILED: status.FAILED,
    }[State(state)]


@dataclasses.dataclass(frozen=True, slots=True)
class JobFacts:
    """What a `TaskResult` is made of, from the row and its journal."""

    id: int
    state: str
    enqueued_at: datetime | None
    started_at: datetime | None
    """Start of the latest run."""
    finished_at: datetime | None
    claimed_by: str
    result: Any
    runs: list[Run]


def task_result(framework: Framework, resolved: Resolved, facts: JobFacts) -> Any:
    """Build the framework's `TaskResult` for a job."""
    errors = [_task_error(framework, run) for run in facts.runs if _is_error(run)]
    if facts.state == State.CANCELLED and not any(
        run.outcome == JournalOutcome.CANCELLED for run in facts.runs
    ):
        errors.append(
            framework.error_class(
                exception_class_path=f"{__name__}.TaskCancelled",
                traceback="The job was cancelled before it ran.",
            )
        )
    worker_ids = [run.worker for run in facts.runs]
    if facts.state == State.RUNNING:
        worker_ids.append(facts.claimed_by)
    first_start = next((run.started_at for run in facts.runs if run.started_at), None)
    result = framework.result_class(
        task=resolved.task,
        id=str(facts.id),
        status=status_of(framework, facts.state),
        enqueued_at=facts.enqueued_at,
        started_at=first_start or facts.started_at,
        finished_at=facts.finished_at if facts.state in FINISHED_STATES else None,
        last_attempted_at=facts.started_at,
        args=resolved.args,
        kwargs=resolved.kwargs,
        backend=resolved.task.backend,
        errors=errors,
        worker_ids=worker_ids,
    )
    if facts.state == State.COMPLETED:
        object.__setattr__(result, "_return_value", facts.result)
    return result


def _is_error(run: Run) -> bool:
    if run.outcome == JournalOutcome.CANCELLED:
        return True
    return run.outcome in ERROR_OUTCOMES and bool(run.error_type)


def _task_error(framework: Framework, run: Run) -> Any:
    if run.outcome == JournalOutcome.CANCELLED:
        path = f"{__name__}.TaskCancelled"
    else:
        path = PSEUDO_ERROR_TYPES.get(run.error_type, run.error_type)
    return framework.error_class(
        exception_class_path=path, traceback=run.traceback or run.error_message
    )
