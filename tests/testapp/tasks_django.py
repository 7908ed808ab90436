"""Django Tasks functions on Django's own `django.tasks` (Django 6+), run by venturi.

The same functions as `tasks_backport.py`, which uses the django-tasks backport:
the conformance tests run against each framework installed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django.tasks import TaskContext, task
from django.tasks.signals import task_enqueued, task_finished, task_started

from tests.testapp.task_signals import connect_recorders, record_order
from tests.testapp.text_tasks import SAMPLES

FRAMEWORK = "django.tasks"
connect_recorders(FRAMEWORK, task_enqueued, task_started, task_finished)


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task
def bad_return() -> object:
    return {1, 2}


@task
def non_str_keys() -> dict[object, str]:
    """Keys that JSON writes as text: stored as `json` round-trips them."""
    return {7: "int", 2.5: "float", False: "bool", None: "none"}


@task
def not_a_number() -> float:
    """NaN, which PostgreSQL's jsonb cannot hold."""
    return float("nan")


@task(takes_context=True)
def with_context(context: TaskContext, value: int) -> dict[str, Any]:
    return {
        "value": value,
        "attempt": context.attempt,
        "id": context.task_result.id,
        "status": str(context.task_result.status),
        "worker_ids": len(context.task_result.worker_ids),
        "context_class": f"{type(context).__module__}.{type(context).__qualname__}",
        "result_class": f"{type(context.task_result).__module__}",
    }


@task(takes_context=True)
def flaky(context: TaskContext, fail_times: int) -> int:
    if context.attempt <= fail_times:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return context.attempt


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
async def async_fail(message: str) -> None:
    await asyncio.sleep(0)
    raise ValueError(message)


@task(takes_context=True)
async def async_context(context: TaskContext, value: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"value": value, "attempt": context.attempt, "id": context.task_result.id}


@task(takes_context=True)
def ordered(context: TaskContext, name: str) -> str:
    record_order(context, name)
    return name


@task(queue_name="emails")
def on_emails(address: str) -> str:
    return address


@task
def returns_sample(sample: str) -> str:
    """Return hostile text (tests/test_text.py): stored, or refused as a failure."""
    return SAMPLES[sample]
