"""The `@venturi.task` decorator and the enqueue methods it gives a task class."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from asgiref.sync import sync_to_async
from django.db import transaction

from django_venturi import tracing
from django_venturi.conf import venturi_settings
from django_venturi.registry import (
    MAX_KIND_LENGTH,
    MAX_QUEUE_LENGTH,
    TASKS_KIND_PREFIX,
    RegistrationError,
    TaskSpec,
    default_kind,
    registry,
    validate_name,
)
from django_venturi.states import Priority
from django_venturi.store.backoff import Fibonacci
from django_venturi.store.concurrency import Concurrency
from django_venturi.store.dependencies import AfterFailure, check_after_failure, dependency_ids
from django_venturi.store.rate_limits import RateLimit

if TYPE_CHECKING:
    from django_venturi.models import Job

T = TypeVar("T", bound=type)


class Task:
    """Optional base class: declares the methods `@venturi.task` adds, for type checkers.

    `@venturi.task` works on any dataclass; subclass `Task` as well when you want
    `SendEmail(...).enqueue()` to type-check.
    """

    def enqueue(
        self,
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: Priority | None = None,
        queue: str | None = None,
        using: str | None = None,
        after: Iterable[Job | int] | None = None,
        after_failure: AfterFailure = "cancel",
    ) -> Job:
        """Write this job in the caller's current transaction and return its row.

        With `after` (jobs or ids), the job is `waiting` until all of them complete;
        if one fails or is cancelled, so is this job, unless `after_failure="run"`.
        """
        from django_venturi.enqueue import enqueue_one

        job = enqueue_one(
            self,
            delay=delay,
            run_at=run_at,
            priority=priority,
            queue=queue,
            using=using,
            after=after,
            after_failure=after_failure,
        )
        if venturi_settings.TESTING_EAGER:
            from django_venturi.worker.inline import run_enqueued

            run_enqueued([job])
        return job

    def enqueue_on_commit(
        self,
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: Priority | None = None,
        queue: str | None = None,
        using: str | None = None,
        after: Iterable[Job | int] | None = None,
        after_failure: AfterFailure = "cancel",
    ) -> None:
        """Enqueue when the current transaction commits (at once outside a transaction)."""
        from django_venturi.enqueue import job_database, prepare

        # Refuse a bad payload or option now, not in a callback after the commit.
        prepare(self, delay=delay, run_at=run_at, priority=priority, queue=queue)
        waits_for = None if after is None else dependency_ids(after)
        check_after_failure(after_failure)
        trace_context = tracing.current()  # the span of the ask, not of the commit

        def enqueue() -> None:
            with tracing.held(trace_context):
                self.enqueue(
                    delay=delay,
                    run_at=run_at,
                    priority=priority,
                    queue=queue,
                    using=using,
                    after=waits_for,
                    after_failure=after_failure,
                )

        transaction.on_commit(enqueue, using=job_database(using))

    async def aenqueue(
        self,
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: Priority | None = None,
        queue: str | None = None,
        using: str | None = None,
        after: Iterable[Job | int] | None = None,
        after_failure: AfterFailure = "cancel",
    ) -> Job:
        """The async form of `enqueue`."""
        return await sync_to_async(self.enqueue)(
            delay=delay,
            run_at=run_at,
            priority=priority,
            queue=queue,
            using=using,
            after=after,
            after_failure=after_failure,
        )


_ENQUEUE_METHODS = ("enqueue", "enqueue_on_commit", "aenqueue")


@overload
def task(cls: T, /) -> T: ...


@overload
def task(
    *,
    kind: str | None = None,
    queue: str | None = None,
    priority: Priority = Priority.NORMAL,
    max_attempts: int | None = None,
    give_up_after: timedelta | None = None,
    backoff: Fibonacci | None = None,
    lease: timedelta | None = None,
    concurrency: int | Concurrency | None = None,
    carry: Any = None,
    timeout: timedelta | None = None,
    rate_limit: RateLimit | None = None,
    atomic: bool = False,
    fair_by: str | None = None,
) -> Callable[[T], T]: ...


def task(
    cls: T | None = None,
    /,
    *,
    kind: str | None = None,
    queue: str | None = None,
    priority: Priority = Priority.NORMAL,
    max_attempts: int | None = None,
    give_up_after: timedelta | None = None,
    backoff: Fibonacci | None = None,
    lease: timedelta | None = None,
    concurrency: int | Concurrency | None = None,
    carry: Any = None,
    timeout: timedelta | None = None,
    rate_limit: RateLimit | None = None,
    atomic: bool = False,
    fair_by: str | None = None,
) -> T | Callable[[T], T]:
    """Register a dataclass with a `handle(self, ctx)` method as a task.

    Use it as `@venturi.task` or `@venturi.task(kind=..., queue=..., ...)`, above
    `@dataclasses.dataclass`. The class gains `enqueue`, `enqueue_on_commit` and
    `aenqueue`. Errors in the declaration are raised at import time.

    `atomic=True` runs the handler inside `transaction.atomic()` on the jobs'
    database and writes the job's verdict in that same transaction, fenced by
    the run's claim: a run that lost its claim, or raised, commits nothing.

    `fair_by="account_id"`: the kind's due jobs take turns by the values of that
    payload field (one account's backlog cannot hold back another account's job).
    """

    def register(target: T) -> T:
        spec = _build_spec(
            target,
            kind=kind,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            give_up_after=give_up_after,
            backoff=backoff,
            lease=lease,
            concurrency=concurrency,
            carry=carry,
            timeout=timeout,
            rate_limit=rate_limit,
            atomic=atomic,
            fair_by=fair_by,
        )
        for name in _ENQUEUE_METHODS:
            if not hasattr(target, name):
                setattr(target, name, getattr(Task, name))
        target.venturi_spec = spec  # type: ignore[attr-defined]
        registry.register(spec)
        return target

    if cls is not None:
        return register(cls)
    return register


def _build_spec(target: type, **options: Any) -> TaskSpec:
    name = getattr(target, "__qualname__", repr(target))
    if not isinstance(target, type) or not dataclasses.is_dataclass(target):
        raise RegistrationError(
            f"@venturi.task needs a dataclass: put @dataclasses.dataclass under it on {name}"
        )
    if not callable(getattr(target, "handle", None)):
        raise RegistrationError(f"{name} needs a handle(self, ctx) method")
    kind = options["kind"] or default_kind(target)
    try:
        validate_name(kind, field="kind", max_length=MAX_KIND_LENGTH)
        if options["queue"] is not None:
            validate_name(options["queue"], field="queue", max_length=MAX_QUEUE_LENGTH)
    except ValueError as error:
        raise RegistrationError(f"{name}: {error}") from None
    if kind.startswith(TASKS_KIND_PREFIX):
        raise RegistrationError(
            f"{name}: kind {kind!r} starts with {TASKS_KIND_PREFIX!r}, which is reserved "
            "for Django Tasks jobs; choose another kind="
        )
    _check_positive(name, "max_attempts", options["max_attempts"])
    concurrency = _concurrency(target, name, options["concurrency"])
    for field in ("give_up_after", "lease", "timeout"):
        value = options[field]
        if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
            raise RegistrationError(f"{name}: {field} must be a positive timedelta, got {value!r}")
    if not isinstance(options["priority"], int) or options["priority"] not in Priority.values:
        raise RegistrationError(f"{name}: priority must be a venturi.Priority")
    _check_rate_limit(target, name, options["rate_limit"])
    fair_by = options["fair_by"]
    if fair_by is not None:
        if not isinstance(fair_by, str) or not fair_by:
            raise RegistrationError(
                f"{name}: fair_by must be a payload field's name, got {fair_by!r}"
            )
        _check_payload_field(target, name, "fair_by", fair_by)
    if not isinstance(options["atomic"], bool):
        raise RegistrationError(f"{name}: atomic must be True or False")
    spec = TaskSpec(
        cls=target,
        kind=kind,
        queue=options["queue"],
        priority=Priority(options["priority"]),
        max_attempts=options["max_attempts"],
        give_up_after=options["give_up_after"],
        backoff=options["backoff"] or Fibonacci(),
        lease=options["lease"],
        concurrency=concurrency,
        carry=options["carry"],
        timeout=options["timeout"],
        rate_limit=options["rate_limit"],
        atomic=options["atomic"],
        fair_by=fair_by,
    )
    if spec.atomic and spec.is_async:
        raise RegistrationError(
            f"{name}: atomic=True needs a sync handle(): a transaction cannot span awaits"
        )
    return spec


def _check_rate_limit(target: type, name: str, rate_limit: object) -> None:
    if rate_limit is None:
        return
    if not isinstance(rate_limit, RateLimit):
        raise RegistrationError(
            f"{name}: rate_limit must be a venturi.RateLimit(N, per=timedelta(...)), "
            f"got {rate_limit!r}"
        )
    if rate_limit.key is not None:
        _check_payload_field(target, name, "rate_limit key", rate_limit.key)


def _concurrency(target: type, name: str, value: object) -> Concurrency | None:
    """The task's cap: `concurrency=N` is `Concurrency(N)`; a key must be a payload field."""
    if value is None or isinstance(value, Concurrency):
        cap = value
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        cap = Concurrency(value)
    else:
        raise RegistrationError(
            f"{name}: concurrency must be a positive int, a venturi.Concurrency(N, key=...) "
            f"or None, got {value!r}"
        )
    if cap is not None and cap.key is not None:
        _check_payload_field(target, name, "concurrency key", cap.key)
    return cap


def _check_payload_field(target: type, name: str, what: str, field: str) -> None:
    fields = {field.name for field in dataclasses.fields(target)}
    if field not in fields:
        raise RegistrationError(
            f"{name}: {what} {field!r} is not a field of the payload "
            f"(fields: {', '.join(sorted(fields)) or 'none'})"
        )


def _check_positive(name: str, field: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise RegistrationError(f"{name}: {field} must be a positive int or None, got {value!r}")
