"""Orphan kinds: due jobs that no live worker can run, which would otherwise wait unseen.

A worker claims only the kinds it knows: the `@venturi.task` classes its process
imported, and Django Tasks jobs when `TASKS` names venturi's backend. A job of
any other kind stays `ready` for ever: its task sits in a module venturi does
not import (`jobs.py` instead of `tasks.py`), it was removed or renamed, or its
kind is a typo. So each worker stores the kinds it can run in its registry row
(`WorkerProcess.kinds`), and this module compares the due jobs with the live
workers' rows:

- a (kind, queue) is an orphan when no live worker (not stopped, not stale) both
  serves the queue and knows the kind; one that knows the kind but serves other
  queues does not count (the orphan says `known` then: the queue is the cause);
- a worker whose row has no kinds (one older than this column) might run any
  kind: it is given the benefit of the doubt, so its queues have no orphans
  (no false alarm during a rolling upgrade; after it, every row has its kinds);
- with no live worker at all nothing is an orphan: every due job waits then,
  and the list of workers says why.

`venturi.stats()` lists them; each worker also looks now and then at the queues
it serves (`worker/orphan_watch.py`, on its heartbeat thread, never on the claim
path) and warns about each orphan kind once, then again every few minutes while its
jobs still wait.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min

from django_venturi.registry import registry
from django_venturi.states import State
from django_venturi.store import registration
from django_venturi.store.clock import database_time

WILDCARD = "*"
"""Ends an entry of `WorkerProcess.kinds` that stands for every kind with its prefix
(`tasks:*`, Django Tasks jobs); kind names cannot hold it."""
KINDS_IN_START_LINE = 5
"""How many kinds a worker's start-up line names (all of them at `-v 2`)."""


def runnable_kinds(tasks_kind_prefix: str | None) -> list[str]:
    """What a worker can run, as its registry row says it: its kinds, and `tasks:*`
    when it runs Django Tasks jobs."""
    kinds = registry.kinds()
    if tasks_kind_prefix is not None:
        kinds.append(tasks_kind_prefix + WILDCARD)
    return kinds


def can_run(kinds: Sequence[str], kind: str) -> bool:
    """Whether a worker with these `kinds` (entries of `WorkerProcess.kinds`) runs `kind`."""
    return any(
        kind.startswith(entry[:-1]) if entry.endswith(WILDCARD) else kind == entry
        for entry in kinds
    )


def describe(kinds: Sequence[str], *, all_of_them: bool) -> str:
    """A worker's kinds for its start-up line: the first few, or all of them."""
    if not kinds:
        return "kinds=0 (no task is registered: does venturi import your tasks modules?)"
    if all_of_them or len(kinds) <= KINDS_IN_START_LINE:
        return f"kinds={len(kinds)} ({', '.join(kinds)})"
    shown = ", ".join(kinds[:KINDS_IN_START_LINE])
    more = len(kinds) - KINDS_IN_START_LINE
    return f"kinds={len(kinds)} ({shown} and {more} more; -v 2 lists them all)"


@dataclasses.dataclass(frozen=True, slots=True)
class OrphanKind:
    """Due jobs of one kind in one queue that no live worker can run."""

    kind: str
    queue: str
    jobs: int
    """Ready jobs whose `run_at` has come."""
    oldest_due_age: timedelta
    """How long the oldest of them has waited."""
    known: bool
    """A live worker knows the kind, but none of those serves the queue."""

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["oldest_due_age"] = self.oldest_due_age.total_seconds()
        return data


@dataclasses.dataclass(frozen=True, slots=True)
class Runner:
    """What one live worker runs, as its registry row says."""

    queues: list[str] | None
    """None: every queue."""
    kinds: list[str] | None
    """None: not reported (an older worker), so it might run any kind."""

    def knows(self, kind: str) -> bool:
        return self.kinds is None or can_run(self.kinds, kind)

    def runs(self, kind: str, queue: str) -> bool:
        return (self.queues is None or queue in self.queues) and self.knows(kind)


def find_orphan_kinds(
    alias: str,
    *,
    queues: Sequence[str] | None = None,
    now: datetime | None = None,
    stale_after: timedelta | None = None,
) -> list[OrphanKind]:
    """The orphan kinds of `queues` (None: every queue), most jobs first.

    Workers whose heartbeat is older than `stale_after` (default: three heartbeat
    intervals) do not count.
    """
    now = now or database_time(alias, statement=True)
    runners = live_runners(alias, now=now, stale_after=stale_after)
    if not runners:
        return []
    orphans = [
        OrphanKind(
            kind=kind,
            queue=queue,
            jobs=jobs,
            oldest_due_age=max(now - oldest, timedelta(0)),
            known=any(runner.knows(kind) for runner in runners),
        )
        for kind, queue, jobs, oldest in _due_by_kind(alias, now=now, queues=queues)
        if not any(runner.runs(kind, queue) for runner in runners)
    ]
    return sorted(orphans, key=lambda orphan: (-orphan.jobs, orphan.kind, orphan.queue))


def live_runners(
    alias: str, *, now: datetime, stale_after: timedelta | None = None
) -> list[Runner]:
    """The workers that have not stopped and whose heartbeat is fresh."""
    from django_venturi.models import (  # at call time: importing the package must not load models
        WorkerProcess,
    )

    rows = WorkerProcess.objects.using(alias).filter(stopped_at__isnull=True)
    return [
        Runner(queues=queues, kinds=kinds)
        for queues, kinds, heartbeat_at in rows.values_list("queues", "kinds", "heartbeat_at")
        if not registration.is_stale(heartbeat_at, now, after=stale_after)
    ]


def _due_by_kind(
    alias: str, *, now: datetime, queues: Sequence[str] | None
) -> list[tuple[str, str, int, datetime]]:
    """(kind, queue, due jobs, oldest run_at) of the ready jobs whose time has come."""
    from django_venturi.models import Job

    due = Job.objects.using(alias).filter(state=State.READY, run_at__lte=now)
    if queues is not None:
        due = due.filter(queue__in=list(queues))
    rows = due.values("kind", "queue").annotate(jobs=Count("id"), oldest=Min("run_at")).order_by()
    return [(row["kind"], row["queue"], row["jobs"], row["oldest"]) for row in rows]
