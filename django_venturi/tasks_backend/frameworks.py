"""Django's Tasks frameworks as venturi sees them: `django.tasks` (Django 6+) and the backport.

A project may use both at once (its own code on `django.tasks`, a library on the
`django_tasks` backport), so nothing here assumes one: each framework is loaded
on first use if it is installed, and every venturi job of a Task remembers which
framework its Task came from, so that results, contexts, errors and signals are
always that framework's own types.

The rest of a Tasks job is `envelope.py` (what its row holds, and finding its
Task again) and `task_results.py` (its rows read back as a `TaskResult`).
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import import_module
from typing import Any

from django.dispatch import Signal

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
