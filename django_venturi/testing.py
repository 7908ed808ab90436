"""Helpers for your project's own tests: run jobs inline, drain the queue, check what was enqueued.

    from django_venturi.testing import assert_enqueued, drain, eager, enqueued

- `eager()` (or `VENTURI["TESTING_EAGER"] = True`): each job runs in the
  enqueuing process, as it is enqueued, inside the caller's transaction. For
  unit tests that only care about the effect.
- `drain(kinds=None, queues=None)`: run every due job now, in this process,
  inside the current (test) transaction, until none is due; returns what each
  run ended with. For integration tests in a normal pytest-django `db` test.
- `enqueued(SendEmail, to=...)` / `assert_enqueued(SendEmail, to=...)`: the
  jobs of a task, as task instances, filtered by field values.
- The `venturi_queue` pytest fixture bundles them (installed as a pytest
  plugin with the package; or `from django_venturi.testing import venturi_queue`
  in your `conftest.py`).

`eager()` and `drain()` run jobs with the worker's own code (claim, execution,
verdicts, completion), so a job ends in the same state, with the same journal,
as under `venturi_worker`. Nothing here imports models or reads settings at
import time: pytest may load this module before Django is set up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from django_venturi.worker.inline import INLINE_WORKER, Ran, execute

T = TypeVar("T")

TESTING_WORKER = INLINE_WORKER
"""The worker name the journal shows for jobs run by these helpers."""
DRAIN_LIMIT = 1000


class DrainLimitReached(RuntimeError):
    """`drain()` ran `limit` jobs and more were still due (a job requeueing itself at once?)."""


# ------------------------------------------------------------ eager mode


@contextmanager
def eager(enabled: bool = True) -> Iterator[None]:
    """Within the block, each job runs inline as it is enqueued (`VENTURI["TESTING_EAGER"]`)."""
    from django.conf import settings
    from django.test import override_settings

    current = dict(getattr(settings, "VENTURI", {}))
    with override_settings(VENTURI={**current, "TESTING_EAGER": enabled}):
        yield


# ------------------------------------------------------------ draining


def drain(
    kinds: Sequence[str | type] | None = None,
    queues: Sequence[str] | None = None,
    *,
    using: str | None = None,
    limit: int = DRAIN_LIMIT,
) -> list[Ran]:
    """Run every due job of `kinds` (kind names or task classes) and `queues` until none is due.

    Runs in this thread, inside the current transaction. Jobs that the runs
    enqueue are run too when they are due; a retry waits for its backoff, so it
    is not due yet (use a zero backoff in tests to see retries run).
    """
    from django_venturi.store import statements

    alias = _alias(using)
    try:
        return _drain(alias, kinds, queues, limit)
    finally:
        # The claim's planner settings (a generic plan, index scans only) are the
        # worker's; the test's own queries on this connection are planned as usual.
        statements.reset_planner(alias)


def _drain(
    alias: str, kinds: Sequence[str | type] | None, queues: Sequence[str] | None, limit: int
) -> list[Ran]:
    from django_venturi.conf import venturi_settings
    from django_venturi.registry import registry
    from django_venturi.store.claim import ClaimRequest, claim
    from django_venturi.store.scheduling import TierClock

    wanted = registry.kinds() if kinds is None else [_kind_name(kind) for kind in kinds]
    clock = TierClock(venturi_settings.PRIORITY_WEIGHTS, venturi_settings.QUEUE_WEIGHTS)
    ran: list[Ran] = []
    while True:
        request = ClaimRequest(
            worker=INLINE_WORKER,
            limit=min(100, limit - len(ran) + 1),
            kinds=wanted,
            leases=[registry.get(kind).lease or venturi_settings.DEFAULT_LEASE for kind in wanted],
            queues=list(queues) if queues is not None else None,
            fair_kinds=[kind for kind in wanted if registry.get(kind).fair_by is not None],
        )
        claimed = claim(alias, request, clock)
        if not claimed:
            return ran
        for job in claimed:
            if len(ran) >= limit:
                raise DrainLimitReached(
                    f"drain() ran {limit} job{'' if limit == 1 else 's'} and more are due; "
                    "a job that requeues itself "
                    "with no delay runs until it gives up (raise `limit` if that is expected)"
                )
            ran.append(execute(alias, job))


# ------------------------------------------------------------ what was enqueued


def enqueued(
    task: type[T], *, using: str | None = None, state: str | None = None, **fields: Any
) -> list[T]:
    """The jobs of `task` (any state, or `state`), oldest first, as task instances.

    Keyword arguments filter on payload fields: `enqueued(SendEmail, to="a@example.com")`.
    """
    from django_venturi.models import Job
    from django_venturi.registry import spec_of

    spec = spec_of(task)
    names = {field.name for field in dataclasses.fields(task)}  # type: ignore[arg-type]
    unknown = sorted(set(fields) - names)
    if unknown:
        raise TypeError(
            f"{task.__qualname__} has no field {', '.join(unknown)} "
            f"(fields: {', '.join(sorted(names))})"
        )
    jobs = Job.objects.using(_alias(using)).filter(kind=spec.kind).order_by("id")
    if state is not None:
        jobs = jobs.filter(state=state)
    instances = [spec.decode(payload) for payload in jobs.values_list("payload", flat=True)]
    return [
        instance
        for instance in instances
        if all(getattr(instance, name) == value for name, value in fields.items())
    ]


def assert_enqueued(
    task: type[T],
    *,
    count: int | None = None,
    using: str | None = None,
    state: str | None = None,
    **fields: Any,
) -> list[T]:
    """Fail unless jobs of `task` matching `fields` were enqueued (exactly `count`, if given)."""
    found = enqueued(task, using=using, state=state, **fields)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    everything = enqueued(task, using=using, state=state)
    wanted = "" if count is None else f"{count} "
    where = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    listing = "\n".join(f"  {instance!r}" for instance in everything) or "  (none)"
    raise AssertionError(
        f"expected {wanted}{task.__qualname__} job(s){' with ' + where if where else ''}, "
        f"found {len(found)}; all {task.__qualname__} jobs:\n{listing}"
    )


# ------------------------------------------------------------ the pytest fixture


class VenturiQueue:
    """What the `venturi_queue` fixture gives: the helpers above, on one database alias."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def drain(
        self, kinds: Sequence[str | type] | None = None, queues: Sequence[str] | None = None
    ) -> list[Ran]:
        return drain(kinds, queues, using=self.using)

    def enqueued(self, task: type[T], **fields: Any) -> list[T]:
        return enqueued(task, using=self.using, **fields)

    def assert_enqueued(self, task: type[T], *, count: int | None = None, **fields: Any) -> list[T]:
        return assert_enqueued(task, count=count, using=self.using, **fields)

    def eager(self, enabled: bool = True) -> Any:
        return eager(enabled)


try:
    import pytest
except ImportError:  # pragma: no cover - the fixture needs pytest, the helpers do not
    pass
else:

    @pytest.fixture
    def venturi_queue(db: None) -> VenturiQueue:
        """The queue helpers for one test, in pytest-django's `db` transaction."""
        return VenturiQueue()


def _alias(using: str | None) -> str:
    from django_venturi.conf import venturi_settings

    return using or venturi_settings.DATABASE


def _kind_name(kind: str | type) -> str:
    if isinstance(kind, str):
        return kind
    from django_venturi.registry import spec_of

    return spec_of(kind).kind
