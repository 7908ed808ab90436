"""A Django Tasks job's rows read back as the framework's own `TaskResult`.

The job row gives the status and the stored return value, its journal the
attempts, workers and errors; the result is built with the types of the
framework the job's Task came from.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django_venturi.states import FINISHED_STATES, JournalOutcome, State
from django_venturi.tasks_backend.envelope import Resolved
from django_venturi.tasks_backend.frameworks import Framework, TaskCancelled, WorkerLost


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
    "django_venturi.LeaseExpired": f"{WorkerLost.__module__}.{WorkerLost.__qualname__}",
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
                exception_class_path=f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}",
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
        path = f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}"
    else:
        path = PSEUDO_ERROR_TYPES.get(run.error_type, run.error_type)
    return framework.error_class(
        exception_class_path=path, traceback=run.traceback or run.error_message
    )
