"""Workflows: jobs that wait for other jobs (`enqueue(after=[...])`).

A job enqueued after unfinished jobs is `waiting`, with `waiting_for` counting
them, and one `Dependency` row per job it waits for. The jobs it waits for are
counted in `dependents`; only their verdicts look for dependents, so a job
without any pays nothing.

When a job with dependents finishes, its dependents are resolved in the
transaction of the finishing write. On PostgreSQL a verdict batch that
completes such jobs does it in its own statement (`completion.py`); otherwise
`resolve` runs in the write's transaction (a failure, a cancel, SQLite). It
marks the job's open edges resolved and, for each dependent,

- counts a completed dependency (or any finished one, for a dependent enqueued
  with `after_failure="run"`) off `waiting_for`; the update that takes it to
  zero makes the job `ready`;
- cancels a waiting dependent of a failed or cancelled job, naming the
  dependency in its `last_error` and its journal, and resolves that job's own
  dependents in turn (transitively).

Fan-in is race-free without locks of our own: each edge belongs to one
dependency, so only its verdict resolves it; the decrement of a dependent is a
row update, which PostgreSQL serialises and re-reads (READ COMMITTED), so of
two verdicts finishing the last dependencies at once exactly one sees the
count reach zero, and a dependent is only ever changed while it is `waiting`.

A dependent enqueued after a dependency was claimed (or while the verdict's
statement waited for the dependency's row) is resolved in a second transaction
right after the verdict's (`completion.py`). A worker killed between the two
leaves open edges on a finished job: every live worker's rescue step
(`recover_stranded`, each `RESCUE_INTERVAL`) finds them through the partial index
of open edges and resolves them with `resolve`, as the verdict would have.
Cleanup resolves a finished job's open edges before deleting it (the delete
would take its edges with it), so a dependent is never left counting a job that
is gone.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from django.db import connections, transaction
from django.db.models import F, OuterRef, Subquery

from django_venturi.conf import venturi_settings
from django_venturi.states import FINISHED_STATES, JournalOutcome, State
from django_venturi.store import statements
from django_venturi.store.clock import now_expression
from django_venturi.store.notify import wake_workers
from django_venturi.store.row_locks import own_rows

if TYPE_CHECKING:
    from django_venturi.models import Job

AfterFailure = Literal["cancel", "run"]
AFTER_FAILURE_CHOICES: tuple[AfterFailure, ...] = ("cancel", "run")
DEPENDENCY_FAILED = "django_venturi.DependencyFailed"
"""The error type of a job cancelled because a job it waited for did not complete."""


class UnknownDependency(LookupError):
    """`enqueue(after=[...])` named a job that does not exist."""


@dataclasses.dataclass(frozen=True, slots=True)
class Dependencies:
    """The jobs a new job waits for, locked, as they stood at its enqueue."""

    ids: tuple[int, ...]
    unfinished: tuple[int, ...]
    """Not finished yet: the new job waits for these."""
    failed: tuple[tuple[int, str], ...]
    """(id, state) of those that ended failed or cancelled."""
    run_after_failure: bool

    def blocked_by(self) -> tuple[int, str] | None:
        """The failed dependency that cancels the new job at once, if any."""
        if self.run_after_failure or not self.failed:
            return None
        return self.failed[0]


def dependency_ids(after: Iterable[Job | int]) -> list[int]:
    """The ids of `after` (jobs or ids), each once, in order."""
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise TypeError("after must be a list of jobs or job ids")
    ids: dict[int, None] = {}
    for item in after:
        if isinstance(item, bool) or (not isinstance(item, int) and not hasattr(item, "pk")):
            raise TypeError(f"after: expected a Job or a job id, got {type(item).__name__}")
        ids[item if isinstance(item, int) else int(item.pk)] = None
    return list(ids)


def check_after_failure(after_failure: str) -> bool:
    """Whether `after_failure` asks to run after a failed dependency; refuse other values."""
    if after_failure not in AFTER_FAILURE_CHOICES:
        raise ValueError(f'after_failure must be "cancel" or "run", got {after_failure!r}')
    return after_failure == "run"


def lock(alias: str, ids: Sequence[int], *, jobs: int, run_after_failure: bool) -> Dependencies:
    """Lock the jobs named by `ids`, count `jobs` new dependents on the unfinished ones,
    and say how they stand.

    The lock makes a dependency's verdict wait for this enqueue's transaction, and
    the count tells that verdict to look for dependents (a verdict whose statement
    started before this enqueue committed sees the count change: see
    `completion.py`). Raises `UnknownDependency` for an id with no job.
    """
    from django_venturi.models import Job

    locked = Job.objects.using(alias).select_for_update().filter(id__in=ids).order_by("id")
    states = dict(locked.values_list("id", "state"))
    missing = [job_id for job_id in ids if job_id not in states]
    if missing:
        named = ", ".join(f"#{job_id}" for job_id in missing)
        raise UnknownDependency(f"after: no job {named} (a job waits only for existing jobs)")
    unfinished = tuple(job_id for job_id in ids if states[job_id] not in FINISHED_STATES)
    if unfinished:
        Job.objects.using(alias).filter(id__in=unfinished).update(dependents=F("dependents") + jobs)
    failed = tuple(
        (job_id, states[job_id])
        for job_id in ids
        if states[job_id] in (State.FAILED, State.CANCELLED)
    )
    return Dependencies(tuple(ids), unfinished, failed, run_after_failure)


def attach(alias: str, jobs: Sequence[Job], dependencies: Dependencies) -> None:
    """Record the edges of jobs just inserted as `ready`, and make them wait (or cancel them).

    Runs in the enqueue's transaction, so nobody ever sees these jobs `ready`.
    """
    from django_venturi.models import Dependency, Job

    open_ids = set(dependencies.unfinished)
    Dependency.objects.using(alias).bulk_create(
        Dependency(
            dependent_id=job.pk,
            dependency_id=dependency_id,
            run_after_failure=dependencies.run_after_failure,
            resolved=dependency_id not in open_ids,
        )
        for job in jobs
        for dependency_id in dependencies.ids
    )
    blocked = dependencies.blocked_by()
    if blocked is not None:
        _cancel(alias, {job.pk: blocked for job in jobs}, from_state=State.READY)
        for job in jobs:
            job.state = State.CANCELLED
        return
    if open_ids:
        waiting = len(open_ids)
        Job.objects.using(alias).filter(id__in=[job.pk for job in jobs]).update(
            state=State.WAITING, waiting_for=waiting
        )
        for job in jobs:
            job.state, job.waiting_for = State.WAITING, waiting


def resolve(alias: str, finished: Iterable[int]) -> None:
    """Resolve the dependents of jobs that just finished, transitively.

    Call it inside the transaction that finished them. Ids of jobs that are not
    finished, or have no open edges, are skipped.
    """
    from django_venturi.models import Dependency

    frontier = list(finished)
    if not frontier:
        return
    if connections[alias].vendor == "postgresql" and not _count_completions(alias, frontier):
        return
    while frontier:
        edges = list(
            Dependency.objects.using(alias)
            .select_for_update(of=own_rows(alias))
            .filter(
                dependency_id__in=frontier,
                resolved=False,
                dependency__state__in=FINISHED_STATES,
            )
            .order_by("id")
            .values_list(
                "id", "dependent_id", "dependency_id", "run_after_failure", "dependency__state"
            )
        )
        if not edges:
            return
        Dependency.objects.using(alias).filter(id__in=[edge[0] for edge in edges]).update(
            resolved=True
        )
        done: Counter[int] = Counter()
        doomed: dict[int, tuple[int, str]] = {}
        for _, dependent, dependency, run_after_failure, state in edges:
            if state == State.COMPLETED or run_after_failure:
                done[dependent] += 1
            else:
                doomed.setdefault(dependent, (dependency, state))
        _count_done(alias, {d: n for d, n in done.items() if d not in doomed})
        frontier = _cancel(alias, doomed)


# Given `finished(id, state)`, the jobs just finished: their edges that count as done
# (a completed dependency, or any finished one for a dependent enqueued with
# after_failure="run") are resolved and counted off their dependents, and the
# dependents that reach zero become ready and wake their queues' workers. Both
# updates lock their rows and re-read them if a concurrent transaction changed them
# (READ COMMITTED), so of two verdicts finishing a dependent's last two dependencies
# at once, exactly one takes it to zero. Shared with the verdict statement
# (`completion.py`); `resolve_params()` gives its parameters.
COUNT_COMPLETIONS_CTES = """
counted AS (
    UPDATE {dependency} AS edge SET resolved = true
    FROM finished
    WHERE edge.dependency_id = finished.id AND NOT edge.resolved
      AND (finished.state = %(completed)s OR edge.run_after_failure)
    RETURNING edge.dependent_id
),
counts AS (SELECT dependent_id, count(*) AS done FROM counted GROUP BY dependent_id),
readied AS (
    UPDATE {job} AS job
    SET waiting_for = greatest(job.waiting_for - counts.done, 0),
        state = CASE WHEN job.waiting_for <= counts.done THEN %(ready)s ELSE job.state END
    FROM counts
    WHERE job.id = counts.dependent_id AND job.state = %(waiting)s
    RETURNING job.state, job.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, queue)
    FROM (SELECT DISTINCT queue FROM readied WHERE state = %(ready)s) AS queues
)
"""

# One round trip for what most resolves need; what is left (failures that cancel
# dependents) is said by the last column, for `resolve`'s loop.
_COUNT_COMPLETIONS_SQL = """
WITH finished AS (
    SELECT id, state FROM {job}
    WHERE id = ANY(%(ids)s::bigint[]) AND state = ANY(%(finished)s::text[])
),
{count_completions}
SELECT (SELECT count(*) FROM woken),
       EXISTS (SELECT 1 FROM {dependency} AS edge JOIN finished ON edge.dependency_id = finished.id
               WHERE NOT edge.resolved AND finished.state <> %(completed)s
                 AND NOT edge.run_after_failure)
"""


def resolve_params() -> dict[str, str]:
    """The parameters of `COUNT_COMPLETIONS_CTES` but `finished`'s own."""
    return {
        "completed": State.COMPLETED.value,
        "ready": State.READY.value,
        "waiting": State.WAITING.value,
        "channel": venturi_settings.NOTIFY_CHANNEL,
    }


def _count_completions(alias: str, finished: Sequence[int]) -> bool:
    """Resolve the edges of `finished` that count as done (PostgreSQL, one statement);
    return whether some of their dependents are to be cancelled."""
    from django_venturi.models import Dependency, Job

    quote = connections[alias].ops.quote_name
    tables = {
        "job": quote(Job._meta.db_table),
        "dependency": quote(Dependency._meta.db_table),
    }
    sql = _COUNT_COMPLETIONS_SQL.format(
        count_completions=COUNT_COMPLETIONS_CTES.format(**tables), **tables
    )
    params = {
        "ids": list(finished),
        "finished": [state.value for state in FINISHED_STATES],
        **resolve_params(),
    }
    ((_, cascades),) = statements.fetch(alias, sql, params, session=statements.WORKER_SESSION)
    return bool(cascades)


STRANDED_BATCH_SIZE = 100
"""Finished jobs with open edges that one `recover_stranded` pass resolves at most."""


def recover_stranded(alias: str) -> list[int]:
    """Resolve the dependents of finished jobs whose verdict left them unresolved;
    return the ids of those jobs.

    A worker killed between a verdict and its follow-up resolve (see `completion.py`)
    leaves a finished job with open edges. Workers call this in their rescue step:
    one query over the partial index of open edges, probing each edge's job by
    primary key (when nothing is stranded only unfinished jobs' edges are open, so
    its cost follows the workflows in flight, not the table: about 15 ms for 10,000
    open edges), and nothing more unless it finds some. Each job found is resolved
    in a transaction of its own by `resolve`, under a lock on its row taken with
    SKIP LOCKED (a job that someone else holds, such as a cleanup batch deleting
    it, is left for the next pass); the edges are re-read under their own locks, so
    of this pass and a late follow-up of the verdict resolving the same edges, each
    edge is counted once. Locks are taken job row first, then edges, then
    dependents, the order of a verdict's transaction and of cleanup.
    """
    from django_venturi.models import Dependency, Job

    # The job's state by a subquery, not a join: PostgreSQL probes the primary key
    # once per open edge, where a join may walk the job table's whole primary key
    # index (a merge join) to meet the few open edges.
    dependency_state = Subquery(
        Job.objects.using(alias).filter(id=OuterRef("dependency_id")).values("state")[:1]
    )
    stranded = (
        Dependency.objects.using(alias)
        .alias(dependency_state=dependency_state)
        .filter(resolved=False, dependency_state__in=FINISHED_STATES)
        .values_list("dependency_id", flat=True)[:STRANDED_BATCH_SIZE]
    )
    recovered: list[int] = []
    for job_id in dict.fromkeys(stranded):
        with transaction.atomic(using=alias):
            held = (
                Job.objects.using(alias)
                .select_for_update(skip_locked=True)
                .filter(id=job_id, state__in=FINISHED_STATES)
                .values_list("id", flat=True)
            )
            if list(held):
                resolve(alias, [job_id])
                recovered.append(job_id)
    return recovered


def move_dependents(alias: str, absorbed: Sequence[int], survivor: int) -> None:
    """Point the open edges of jobs merged into `survivor` (dedup) at the survivor.

    A dependent that already waits for the survivor counts one dependency fewer.
    """
    from django_venturi.models import Dependency, Job

    edges = Dependency.objects.using(alias).filter(dependency_id__in=absorbed, resolved=False)
    moving = list(edges.values_list("id", "dependent_id"))
    if not moving:
        return
    already = set(
        Dependency.objects.using(alias)
        .filter(dependency_id=survivor, dependent_id__in=[d for _, d in moving])
        .values_list("dependent_id", flat=True)
    )
    # A dependent already waiting for the survivor (or for two absorbed jobs) keeps
    # one edge to it; its other edges go, each one dependency fewer to wait for.
    kept: list[int] = []
    dropped: list[int] = []
    twice: Counter[int] = Counter()
    for edge_id, dependent in moving:
        if dependent in already:
            dropped.append(edge_id)
            twice[dependent] += 1
        else:
            already.add(dependent)
            kept.append(edge_id)
    Dependency.objects.using(alias).filter(id__in=dropped).delete()
    Dependency.objects.using(alias).filter(id__in=kept).update(dependency_id=survivor)
    for dependent, count in twice.items():
        Job.objects.using(alias).filter(id=dependent, state=State.WAITING).update(
            waiting_for=F("waiting_for") - count
        )
    Job.objects.using(alias).filter(id=survivor).update(dependents=F("dependents") + len(moving))


def _count_done(alias: str, done: dict[int, int]) -> None:
    """Count finished dependencies off waiting jobs; a job reaching zero becomes `ready`."""
    from django_venturi.models import Job

    waiting = _locked(alias, done, State.WAITING)
    readied = [job_id for job_id, left in waiting if left <= done[job_id]]
    if readied:
        Job.objects.using(alias).filter(id__in=readied).update(state=State.READY, waiting_for=0)
        queues = Job.objects.using(alias).filter(id__in=readied).values_list("queue", flat=True)
        wake_workers(alias, queues)
    by_count: defaultdict[int, list[int]] = defaultdict(list)
    for job_id, left in waiting:
        if left > done[job_id]:
            by_count[done[job_id]].append(job_id)
    for count, job_ids in by_count.items():
        Job.objects.using(alias).filter(id__in=job_ids).update(waiting_for=F("waiting_for") - count)


def _locked(alias: str, job_ids: Iterable[int], state: State) -> list[tuple[int, int]]:
    """(id, waiting_for) of those jobs still in `state`, locked, as last committed.

    In id order, so that two transactions lock shared dependents alike.
    """
    from django_venturi.models import Job

    return list(
        Job.objects.using(alias)
        .select_for_update()
        .filter(id__in=list(job_ids), state=state)
        .order_by("id")
        .values_list("id", "waiting_for")
    )


def _cancel(
    alias: str, doomed: dict[int, tuple[int, str]], from_state: State = State.WAITING
) -> list[int]:
    """Cancel jobs whose dependency failed or was cancelled; return those cancelled.

    `from_state`: `ready` for jobs just inserted by an enqueue after a failed job.
    """
    from django_venturi.models import Job, JournalEntry

    cancelled = [job_id for job_id, _ in _locked(alias, doomed, from_state)]
    if not cancelled:
        return []
    now = now_expression(alias)
    entries: list[JournalEntry] = []
    for job_id in cancelled:
        dependency, state = doomed[job_id]
        reason = f"job #{dependency}, which it was enqueued after, ended {state}"
        Job.objects.using(alias).filter(id=job_id).update(
            state=State.CANCELLED,
            finished_at=now,
            waiting_for=0,
            last_error=f"{DEPENDENCY_FAILED}: {reason}",
            error_type=DEPENDENCY_FAILED,
        )
        entries.append(
            JournalEntry(
                job_id=job_id,
                attempt=0,
                outcome=JournalOutcome.CANCELLED,
                error_type=DEPENDENCY_FAILED,
                error_message=reason,
            )
        )
    JournalEntry.objects.using(alias).bulk_create(entries)
    return cancelled
