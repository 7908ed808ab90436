"""How a worker runs a Django Tasks job: find its Task, call it, judge what happened.

The worker treats these jobs like any other (claim, lease, heartbeat, verdict,
journal); only the handler differs. The Task is found by `envelope.resolve`,
which imports only modules of installed apps, of `VENTURI["TASK_MODULES"]` or
signed by the producer, and accepts nothing but a Task of the framework the job
recorded. Django's semantics hold by default: the return value is stored and the
job is SUCCESSFUL; an exception makes it FAILED, with no retry unless the
backend's `OPTIONS["MAX_ATTEMPTS"]` allows more runs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings
from django.dispatch import Signal
from django.utils import timezone

from django_venturi.conf import venturi_settings
from django_venturi.payloads.size import check_size
from django_venturi.payloads.text import text_of
from django_venturi.registry import TASKS_KIND_PREFIX
from django_venturi.states import JournalOutcome, State
from django_venturi.store import verdicts
from django_venturi.store.backoff import Fibonacci
from django_venturi.store.claim import ClaimedJob
from django_venturi.store.connections import closing_broken_on_error
from django_venturi.store.verdicts import ErrorInfo, Verdict
from django_venturi.tasks_backend import envelope, frameworks, task_results

if TYPE_CHECKING:
    from django_venturi.tasks_backend.backend import VenturiBackend

logger = logging.getLogger("django_venturi.worker")


class Execution(Protocol):
    """What running a Tasks job needs of the worker's run (`execution.Execution`)."""

    @property
    def job(self) -> ClaimedJob: ...

    @property
    def worker(self) -> str: ...

    @property
    def database(self) -> str: ...


def claimable_prefix() -> str | None:
    """The kind prefix of Tasks jobs when TASKS names venturi's backend, else None.

    A worker of a project without the backend leaves Tasks jobs alone, as it
    leaves any kind it does not know.
    """
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return None
    paths = [entry.get("BACKEND") for entry in tasks.values() if isinstance(entry, dict)]
    if not any(isinstance(path, str) and path.startswith("django_venturi.") for path in paths):
        return None
    from django_venturi.tasks_backend.backend import is_venturi_backend

    if any(is_venturi_backend(path) for path in paths) and frameworks.available():
        return TASKS_KIND_PREFIX
    return None


def is_tasks_job(job: ClaimedJob) -> bool:
    return job.kind.startswith(TASKS_KIND_PREFIX)


def is_async(execution: Execution) -> bool:
    """Whether the job's Task function is `async def` (False if it names no Task)."""
    try:
        resolved = envelope.resolve(execution.job.kind, execution.job.payload)
    except Exception:
        return False  # the run turns it into a permanent failure
    return envelope.is_async(resolved.task)


@dataclasses.dataclass(frozen=True, slots=True)
class TasksRun:
    """A Tasks job about to run: its Task, backend and `TaskResult` (RUNNING)."""

    execution: Execution
    resolved: envelope.Resolved
    backend: VenturiBackend
    facts: task_results.JobFacts
    result: Any

    @property
    def framework(self) -> frameworks.Framework:
        return self.resolved.framework

    def arguments(self) -> tuple[list[Any], dict[str, Any]]:
        args = list(self.resolved.args)
        if self.resolved.task.takes_context:
            args.insert(0, self.framework.context_class(task_result=self.result))
        return args, dict(self.resolved.kwargs)


def run_sync(execution: Execution) -> Verdict:
    prepared = _prepare(execution)
    if isinstance(prepared, Verdict):
        return prepared
    args, kwargs = prepared.arguments()
    try:
        value = prepared.resolved.task.call(*args, **kwargs)
    except BaseException as error:  # the handler boundary, as for venturi tasks
        return _failed(prepared, error)
    return _succeeded(prepared, value)


async def run_async(execution: Execution) -> Verdict:
    prepared = await sync_to_async(closing_broken_on_error(_prepare), thread_sensitive=False)(
        execution
    )
    if isinstance(prepared, Verdict):
        return prepared
    args, kwargs = prepared.arguments()
    try:
        value = await prepared.resolved.task.acall(*args, **kwargs)
    except BaseException as error:
        return _failed(prepared, error)
    return _succeeded(prepared, value)


def _prepare(execution: Execution) -> TasksRun | Verdict:
    """Resolve the job's Task and send `task_started`; a row naming no Task fails for good."""
    from django_venturi.tasks_backend.backend import VenturiBackend

    job = execution.job
    try:
        resolved = envelope.resolve(job.kind, job.payload)
        backend = resolved.task.get_backend()
        if not isinstance(backend, VenturiBackend):
            raise frameworks.UnrunnableTask(
                f"TASKS[{resolved.task.backend!r}] is {type(backend).__qualname__}, "
                "not django_venturi's backend"
            )
    except Exception as error:
        if not isinstance(error, frameworks.UnrunnableTask):
            error = frameworks.UnrunnableTask(f"{type(error).__name__}: {text_of(error)}")
        return verdicts.failed(job, ErrorInfo.from_reason(text_of(error), type=_path(error)))
    facts = task_results.JobFacts(
        id=job.id,
        state=State.RUNNING,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        finished_at=None,
        claimed_by=execution.worker,
        result=None,
        runs=task_results.runs_of(execution.database, job.id),
    )
    result = task_results.task_result(resolved.framework, resolved, facts)
    run = TasksRun(execution, resolved, backend, facts, result)
    _send(run, resolved.framework.task_started, result)
    return run


def _succeeded(run: TasksRun, value: Any) -> Verdict:
    try:
        stored = envelope.stored_result(value)
        check_size(stored, "the return value", venturi_settings.MAX_PAYLOAD_BYTES)
    except Exception as error:  # a PayloadError, or whatever the value's own methods raised
        return _failed(run, error)
    verdict = verdicts.completed(run.execution.job)
    return dataclasses.replace(
        verdict,
        set_result=True,
        result=stored,
        after_write=_finished_signal(run, verdict, stored),
    )


def _failed(run: TasksRun, error: BaseException) -> Verdict:
    """FAILED, or with `MAX_ATTEMPTS` > 1 and runs left, READY again after backoff."""
    job = run.execution.job
    info = ErrorInfo.from_exception(error)
    failures = job.failures + 1
    if failures >= run.backend.max_attempts:
        verdict = verdicts.failed(job, info)
    else:
        delay = Fibonacci().delay(job_id=job.id, failures=failures)
        verdict = Verdict(
            job, JournalOutcome.RETRY, State.READY, delay=delay, failed_run=True, error=info
        )
    return dataclasses.replace(verdict, after_write=_finished_signal(run, verdict, None, error))


def _finished_signal(
    run: TasksRun, verdict: Verdict, value: Any, error: BaseException | None = None
) -> Any:
    """`task_finished`, sent once the verdict is written (so `refresh()` sees it).

    `error` is what the task raised, if it did: the signal is then sent inside a
    handler of it (see `_in_handler_of`). It is sent once, and the exception is
    held no longer than that (its traceback keeps the run's frames alive).
    """

    def send(applied: bool) -> None:
        nonlocal error
        raised, error = error, None
        if not applied:
            return  # this worker had lost the job: another run owns its result
        this_run = task_results.Run(
            worker=run.execution.worker,
            started_at=verdict.job.started_at,
            outcome=verdict.outcome,
            error_type=verdict.error.type,
            error_message=verdict.error.message,
            traceback=verdict.error.traceback,
        )
        facts = dataclasses.replace(
            run.facts,
            state=verdict.state,
            finished_at=timezone.now() if verdict.state != State.READY else None,
            result=value,
            runs=[*run.facts.runs, this_run],
        )
        result = task_results.task_result(run.framework, run.resolved, facts)
        if raised is None:
            _send(run, run.framework.task_finished, result)
        else:
            _in_handler_of(raised, lambda: _send(run, run.framework.task_finished, result))

    return send


def _in_handler_of(error: BaseException, call: Callable[[], None]) -> None:
    """Call `call` inside an `except` block handling `error`, as if it had just been caught.

    Django's own backends send `task_finished` of a failed task from their
    `except` block, and both frameworks' logging receivers rely on it: they log
    `sys.exc_info()` (the backport with `logger.exception`), which error trackers
    such as Sentry pick up. venturi sends it later, from the results writer once
    the verdict is written, so the task's exception is raised again here. Raising
    prepends this frame to its traceback (and would chain a handled exception as
    its context): both are put back, so `sys.exc_info()` gives the traceback the
    task left, the one its `TaskError` shows, and no cycle runs through this frame.
    """
    traceback, context = error.__traceback__, error.__context__
    try:
        raise error
    except BaseException:
        error.__traceback__, error.__context__ = traceback, context
        call()
    finally:
        error.__traceback__, error.__context__ = traceback, context


def _send(run: TasksRun, signal: Signal, result: Any) -> None:
    """Send a Tasks signal; a failing receiver is logged and changes nothing."""
    for receiver, response in signal.send_robust(type(run.backend), task_result=result):
        if isinstance(response, Exception):
            logger.error(
                "Tasks signal receiver %r failed for job %d: %s",
                receiver,
                run.execution.job.id,
                response,
                exc_info=response,
                extra={"job_id": run.execution.job.id, "kind": run.execution.job.kind},
            )


def _path(error: BaseException) -> str:
    return f"{type(error).__module__}.{type(error).__qualname__}"
