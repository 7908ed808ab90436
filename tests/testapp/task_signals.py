"""Receivers of the Tasks frameworks' signals that leave a Record, so tests can see them.

Signals of runs are sent in the worker process; the records let the test
process see which signal came, for which job, with which status and types.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

from tests.testapp.models import Record


def connect_recorders(framework: str, enqueued: Signal, started: Signal, finished: Signal) -> None:
    for name, signal in (
        ("task_enqueued", enqueued),
        ("task_started", started),
        ("task_finished", finished),
    ):
        signal.connect(_recorder(framework, name), weak=False, dispatch_uid=f"{framework}:{name}")


def _recorder(framework: str, name: str) -> Any:
    def receive(sender: type, task_result: Any, **kwargs: Any) -> None:
        backend = task_result.task.get_backend()
        Record.objects.using(backend.database).create(
            job_id=int(task_result.id),
            kind=f"{framework}:{name}",
            attempt=task_result.attempts,
            value={
                "status": str(task_result.status),
                "result_class": type(task_result).__module__,
                "sender": sender.__name__,
                "errors": len(task_result.errors),
            },
        )

    return receive


def record_order(context: Any, name: str) -> None:
    backend = context.task_result.task.get_backend()
    Record.objects.using(backend.database).create(
        job_id=int(context.task_result.id), kind="ordered", attempt=context.attempt, value=name
    )
