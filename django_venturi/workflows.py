"""`venturi.chain()` and `venturi.group()`: several jobs enqueued as one workflow.

Both are built on `enqueue(after=[...])` (see `dependencies.py`) and write every
job in one transaction: the caller's, if there is one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import transaction

from django_venturi.store.dependencies import AfterFailure, check_after_failure

if TYPE_CHECKING:
    from django_venturi.models import Job


@dataclasses.dataclass(frozen=True, slots=True)
class Chain:
    """Tasks that run one after another; build it with `venturi.chain(...)`."""

    tasks: tuple[object, ...]

    def enqueue(self, *, using: str | None = None) -> list[Job]:
        """Enqueue every task, each after the previous one; return the jobs in order.

        If a step fails or is cancelled, the steps after it end `cancelled`.
        """
        from django_venturi.enqueue import enqueue_one, job_database

        jobs: list[Job] = []
        with transaction.atomic(using=job_database(using)):
            for step in self.tasks:
                after = [jobs[-1]] if jobs else None
                jobs.append(enqueue_one(step, using=using, after=after))
        _run_if_eager(jobs)
        return jobs


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """Tasks that run side by side, then one callback; build it with `venturi.group(...)`."""

    tasks: tuple[object, ...]
    then: object
    after_failure: AfterFailure = "cancel"

    def enqueue(self, *, using: str | None = None) -> tuple[list[Job], Job]:
        """Enqueue the members, then the callback after all of them: `(members, callback)`.

        The callback runs once, after the last member completes, however many workers
        finish members at the same moment.
        """
        from django_venturi.enqueue import enqueue_many, enqueue_one, job_database

        with transaction.atomic(using=job_database(using)):
            members = enqueue_many(self.tasks, using=using)
            callback = enqueue_one(
                self.then, using=using, after=members, after_failure=self.after_failure
            )
        _run_if_eager([*members, callback])
        return members, callback


def _run_if_eager(jobs: list[Job]) -> None:
    """Eager mode (`venturi.testing.eager()`): run the workflow now, in order; a job
    whose dependencies have not all completed by its turn is left as it is."""
    from django_venturi.conf import venturi_settings

    if venturi_settings.TESTING_EAGER:
        from django_venturi.worker.inline import run_enqueued

        run_enqueued(jobs)


def chain(*tasks: object) -> Chain:
    """Chain tasks: `venturi.chain(Fetch(u), Parse(u)).enqueue()` runs them in order."""
    if not tasks:
        raise ValueError("chain() needs at least one task")
    return Chain(tasks)


def group(tasks: Iterable[Any], *, then: object, after_failure: AfterFailure = "cancel") -> Group:
    """Group tasks with a callback: `then` runs once, after every task of the group.

    With `after_failure="run"` the callback runs even if members fail or are cancelled
    (it can tell which from `ctx.dependency_results()` and their states).
    """
    members = tuple(tasks)
    if not members:
        raise ValueError("group() needs at least one task")
    check_after_failure(after_failure)
    return Group(members, then, after_failure)
