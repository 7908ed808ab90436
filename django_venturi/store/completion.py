"""Writing verdicts: each job's next state and its journal entry, fenced by claim token.

Every write is conditional on the job still being `running` under the claim
token this worker got. A worker that lost its lease (another worker recovered
the job) therefore cannot change the job: its verdict is recorded in the
journal as `discarded` and nothing else happens.

Many verdicts are written in one transaction (group commit); on PostgreSQL in
one statement. A keyed job going back to `ready` first absorbs the ready
follow-up of its key, if any (`dedup.fold_returning`), so that the write never
breaks the one-ready-job-per-key index.

A job whose cancel was requested while it ran (`venturi.cancel()`) never goes
back to `ready`: a verdict that would requeue it (paused, retry, timeout)
cancels it instead, even if the worker had not heard of the request yet. Such
a job absorbs no follow-up: the follow-up stays `ready`.

A job with dependents (`enqueue(after=...)`, see `dependencies.py`) resolves
them with its verdict: on PostgreSQL in the same statement when the batch's
jobs known to have dependents all complete, otherwise in the batch's
transaction right after it. Dependents enqueued after the claim, or after the
statement started, are found by what the statement returns and resolved in a
transaction of their own just after; if the worker dies before that one
commits, the workers' rescue step resolves them (`dependencies.recover_stranded`).

A run (a job id and its claim token) has one verdict. When a batch holds more
than one for the same run (say a `released` at shutdown and the handler's
`completed`), the first in the batch is the run's verdict and each later one
is journalled as `discarded`, on every database.

Errors: `write_verdicts` raises the database's errors as they are
(`django.db.DatabaseError` and its subclasses); everything it wrote in the
batch is rolled back with the transaction it runs in. A user's `merge()` that
raises while a returning job absorbs its follow-up is logged and skipped (see
`dedup.fold_returning`); a database error of its queries is undone by a savepoint
and skipped the same way, but a lost connection fails the write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from django_venturi.models import Dependency, Job, JournalEntry
from django_venturi.states import FINISHED_STATES, JournalOutcome, State
from django_venturi.store import dedup, dependencies, statements
from django_venturi.store.verdicts import Verdict

AppliedRun = tuple[int, int]
"""A run whose verdict was applied: its job's id and its attempt (each claim adds one)."""


def write_verdicts(alias: str, worker: str, verdicts: Sequence[Verdict]) -> set[int]:
    """Apply the verdicts; return the ids of the jobs whose verdict was applied.

    The first verdict of each run (job id and claim token) in `verdicts` is the
    one applied; later ones of the same run are journalled as `discarded`.
    """
    return {job_id for job_id, _ in write_runs(alias, worker, verdicts)}


def write_runs(
    alias: str, worker: str, verdicts: Sequence[Verdict], *, wait_for_keys: bool = True
) -> set[AppliedRun]:
    """`write_verdicts`, telling runs apart: (job id, attempt) of each run applied, so
    that a stale run's verdict beside the live run's of the same job is not counted.

    Without `wait_for_keys`, raises `key_locks.KeysBusy` (writing nothing) instead of
    waiting for a dedup key another session holds (see `dedup.fold_returning`)."""
    done = {(v.job.id, v.job.attempt) for v in verdicts if v.written}
    if done:  # applied in an atomic handler's transaction: see `atomic.py`
        rest = [v for v in verdicts if not v.written]
        return done | write_runs(alias, worker, rest, wait_for_keys=wait_for_keys)
    if not verdicts:
        return set()
    repeats = repeated_runs(verdicts)
    if connections[alias].vendor == "postgresql":
        return _write_postgresql(alias, worker, verdicts, repeats, wait_for_keys)
    return _write_orm(alias, worker, verdicts, repeats)


def repeated_runs(verdicts: Sequence[Verdict]) -> list[bool]:
    """For each verdict, whether an earlier one in `verdicts` is of the same run."""
    seen: set[tuple[int, object]] = set()
    repeats: list[bool] = []
    for verdict in verdicts:
        run = (verdict.job.id, verdict.job.claim_token)
        repeats.append(run in seen)
        seen.add(run)
    return repeats


def _folded(
    alias: str, verdicts: Sequence[Verdict], repeats: Sequence[bool], *, wait_for_keys: bool
) -> tuple[list[Verdict], list[dedup.Fold]]:
    """The batch, in its order, after the dedup fold of the first verdict of each run."""
    written, folds = dedup.fold_returning(
        alias,
        [v for v, repeat in zip(verdicts, repeats, strict=True) if not repeat],
        wait_for_keys=wait_for_keys,
    )
    firsts = iter(written)
    batch = [v if repeat else next(firsts) for v, repeat in zip(verdicts, repeats, strict=True)]
    return batch, folds


_FINISH_SQL = """
-- A field whose every value in the batch is its default (no error, no carry, the
-- writing worker...) comes as an empty array, which unnest pads with NULLs: the
-- defaults are put back here. Dumping a parameter array costs psycopg time per
-- element, and most of a batch of completions is defaults.
WITH verdict AS (
    SELECT id, token, attempt, started_at, state, outcome,
           coalesce(delay, interval '0') AS delay, coalesce(set_carry, false) AS set_carry,
           carry, coalesce(failed, 0) AS failed, coalesce(error_type, '') AS error_type,
           coalesce(error_message, '') AS error_message, coalesce(traceback, '') AS traceback,
           coalesce(worker, %(worker)s) AS worker,
           coalesce(set_progress, false) AS set_progress, progress,
           coalesce(set_result, false) AS set_result, result,
           coalesce(repeat, false) AS repeat, n
    FROM unnest(
        %(ids)s::bigint[], %(tokens)s::uuid[], %(attempts)s::integer[], %(started)s::timestamptz[],
        %(states)s::text[], %(outcomes)s::text[], %(delays)s::interval[],
        %(set_carry)s::boolean[], %(carries)s::text[], %(failed)s::integer[],
        %(error_types)s::text[], %(error_messages)s::text[], %(tracebacks)s::text[],
        %(workers)s::text[], %(set_progress)s::boolean[], %(progress)s::text[],
        %(set_result)s::boolean[], %(results)s::text[], %(repeats)s::boolean[]
    ) WITH ORDINALITY AS v(id, token, attempt, started_at, state, outcome, delay, set_carry,
                           carry, failed, error_type, error_message, traceback, worker,
                           set_progress, progress, set_result, result, repeat, n)
),
-- The fence: only a job still running under this claim token changes.
applied AS (
    UPDATE {job} AS job
    -- A cancel asked while the job ran turns a requeue into `cancelled`.
    SET state = CASE WHEN verdict.state = 'ready' AND job.cancel_requested_at IS NOT NULL
                     THEN %(cancelled)s ELSE verdict.state END,
        run_at = CASE WHEN verdict.state = 'ready' THEN now() + verdict.delay ELSE job.run_at END,
        finished_at = CASE WHEN verdict.state = ANY(%(finished)s::text[])
                             OR job.cancel_requested_at IS NOT NULL THEN now() END,
        progress = CASE WHEN verdict.set_progress THEN verdict.progress::jsonb
                        ELSE job.progress END,
        carry = CASE WHEN verdict.set_carry THEN verdict.carry::jsonb ELSE job.carry END,
        result = CASE WHEN verdict.set_result THEN verdict.result::jsonb ELSE job.result END,
        failures = job.failures + verdict.failed,
        -- The run's real start (its handler's), later than the claim if it waited.
        started_at = verdict.started_at,
        last_error = CASE WHEN verdict.error_type = '' THEN job.last_error
                          ELSE verdict.error_type || ': ' || verdict.error_message END,
        error_type = CASE WHEN verdict.error_type = '' THEN job.error_type
                          ELSE verdict.error_type END,
        claim_token = NULL,
        lease_expires_at = NULL
    FROM verdict
    WHERE job.id = ANY(%(ids)s::bigint[])  -- by primary key, whatever the estimates
      AND job.id = verdict.id AND job.claim_token = verdict.token AND job.state = 'running'
      -- A later verdict of a run already in the batch is never applied.
      AND NOT verdict.repeat
    RETURNING job.id, job.state, verdict.token, job.dependents
),
journaled AS (
INSERT INTO {journal}
    (job_id, attempt, worker, started_at, finished_at, outcome, error_type, error_message,
     traceback)
SELECT verdict.id, verdict.attempt, verdict.worker, verdict.started_at, now(),
       -- By run, not by job: a stale run's verdict beside the live run's in one batch
       -- is not the one applied. Looked up in `applied` by hashed subplans, not a
       -- join: the planner thinks `applied` holds one row and would loop over it
       -- once per verdict (a quarter of a million comparisons for a batch of 500).
       CASE WHEN verdict.repeat OR (verdict.id, verdict.token) NOT IN (
                SELECT applied.id, applied.token FROM applied) THEN %(discarded)s
            -- A requeue turned into a cancel (not a dedup fold, whose verdict says so).
            WHEN verdict.state = 'ready' AND (verdict.id, verdict.token) IN (
                SELECT applied.id, applied.token FROM applied
                WHERE applied.state = %(cancelled)s) THEN %(cancelled)s
            ELSE verdict.outcome END,
       verdict.error_type, verdict.error_message, verdict.traceback
FROM verdict
-- Rows of jobs deleted meanwhile (cleanup) have nothing to attach to.
WHERE verdict.id IN (SELECT still.id FROM {job} AS still WHERE still.id = ANY(%(ids)s::bigint[]))
ORDER BY verdict.n  -- journal ids in batch order
RETURNING job_id, attempt, outcome
)
"""

# The batch's own rows, and for each whether the job has dependents left to resolve.
# `dependents` as the update saw it: it counts dependents enqueued after the claim
# too, by an enqueue that the update waited for.
_FINISH_TAIL_SQL = """
SELECT journaled.job_id, journaled.attempt, journaled.outcome,
       journaled.job_id IN (SELECT id FROM applied WHERE applied.dependents > 0)
FROM journaled
"""

# The same, resolving in the statement the dependents of the jobs it completes (see
# `dependencies.py`): their edges are marked resolved and counted off their waiting
# dependents, which become ready (and wake their queues' workers) at zero. Both
# updates lock their rows and re-read them if another transaction changed them, so
# of two verdicts finishing a dependent's last two dependencies at once exactly one
# takes it to zero. The statement sees the edges committed before it started; an
# enqueue that added dependents after that, and that the update of the job waited
# for, changed its `dependents` since the statement's snapshot (`seen`): such a job
# is reported as having dependents left to resolve, and so is one that did not
# complete (its dependents may have to be cancelled).
_FINISH_RESOLVING_TAIL_SQL = """
, seen AS (SELECT id, dependents FROM {job} WHERE id = ANY(%(ids)s::bigint[])),
finished AS (SELECT id, state FROM applied WHERE state = %(completed)s AND dependents > 0),
{count_completions}
SELECT journaled.job_id, journaled.attempt, journaled.outcome,
       journaled.job_id IN (
           SELECT applied.id FROM applied
           WHERE applied.dependents > 0
             AND (applied.state <> %(completed)s
                  -- `seen` by a hashed subplan, not a join: see `journaled`.
                  OR (applied.id, applied.dependents) NOT IN (SELECT id, dependents FROM seen))
       ),
       (SELECT count(*) FROM woken)
FROM journaled
"""


def _write_postgresql(
    alias: str,
    worker: str,
    verdicts: Sequence[Verdict],
    repeats: Sequence[bool],
    wait_for_keys: bool = True,
) -> set[AppliedRun]:
    # Only a job going back to `ready` can need a dedup fold (more statements, one
    # transaction); otherwise the verdicts are one statement, atomic on its own,
    # which spares the BEGIN and COMMIT round trips. Jobs with dependents that
    # complete resolve them in that statement; a batch where one fails or goes back
    # to ready resolves them in the verdicts' transaction, after the statement.
    may_fold = any(v.state == State.READY for v in verdicts)
    known = [v for v in verdicts if v.job.has_dependents]
    resolving = bool(known) and not may_fold and all(v.state == State.COMPLETED for v in known)
    in_transaction = may_fold or (bool(known) and not resolving)
    if in_transaction:  # the SETs of the session would not outlast the transaction
        statements.prime_session(alias, statements.WORKER_SESSION)
    with transaction.atomic(using=alias) if in_transaction else nullcontext():
        batch, folds = _folded(alias, verdicts, repeats, wait_for_keys=wait_for_keys)
        rows = _finish_postgresql(alias, worker, batch, repeats, resolving=resolving)
        dedup.finish_folds(alias, folds)
        discarded = JournalOutcome.DISCARDED
        unresolved = [row[0] for row in rows if row[3] and row[2] != discarded]
        if unresolved and in_transaction:
            dependencies.resolve(alias, unresolved)
    if unresolved and not in_transaction:
        # Dependents enqueued while the job ran (after its claim, or after the
        # statement started), or of a job that failed: see `dependencies.py`.
        with transaction.atomic(using=alias):
            dependencies.resolve(alias, unresolved)
    return {(row[0], row[1]) for row in rows if row[2] != discarded}


def _finish_postgresql(
    alias: str,
    worker: str,
    verdicts: Sequence[Verdict],
    repeats: Sequence[bool],
    *,
    resolving: bool = False,
) -> list[tuple[Any, ...]]:
    """Run the finish statement: apply the verdicts that are not `repeats`, journal all;
    with `resolving`, resolve the dependents of the jobs it completes too."""
    connection = connections[alias]
    tail = _FINISH_RESOLVING_TAIL_SQL if resolving else _FINISH_TAIL_SQL
    tables = {
        "job": connection.ops.quote_name(Job._meta.db_table),
        "journal": connection.ops.quote_name(JournalEntry._meta.db_table),
        "dependency": connection.ops.quote_name(Dependency._meta.db_table),
    }
    sql = (_FINISH_SQL + tail).format(
        count_completions=dependencies.COUNT_COMPLETIONS_CTES.format(**tables), **tables
    )
    params: dict[str, Any] = {
        "ids": [v.job.id for v in verdicts],
        "tokens": [v.job.claim_token for v in verdicts],
        "attempts": [v.job.attempt for v in verdicts],
        "started": [v.job.started_at for v in verdicts],
        "states": [v.state.value for v in verdicts],
        "outcomes": [v.outcome.value for v in verdicts],
        "delays": _unless_all([v.delay for v in verdicts], timedelta(0)),
        "set_carry": _unless_all([v.set_carry for v in verdicts], False),
        "carries": _unless_all(
            [json.dumps(v.carry) if v.set_carry else None for v in verdicts], None
        ),
        "failed": _unless_all([int(v.failed_run) for v in verdicts], 0),
        "error_types": _unless_all([v.error.type for v in verdicts], ""),
        "error_messages": _unless_all([v.error.message for v in verdicts], ""),
        "tracebacks": _unless_all([v.error.traceback for v in verdicts], ""),
        "finished": [state.value for state in FINISHED_STATES],
        "worker": worker,
        "workers": _unless_all([v.worker or worker for v in verdicts], worker),
        "set_result": _unless_all([v.set_result for v in verdicts], False),
        "results": _unless_all(
            [json.dumps(v.result) if v.set_result else None for v in verdicts], None
        ),
        "discarded": JournalOutcome.DISCARDED.value,
        "cancelled": State.CANCELLED.value,
        "set_progress": _unless_all([v.set_progress for v in verdicts], False),
        "progress": _unless_all(
            [json.dumps(v.progress) if v.set_progress else None for v in verdicts], None
        ),
        "repeats": _unless_all(list(repeats), False),
    }
    if resolving:
        params.update(dependencies.resolve_params())
    return statements.fetch(alias, sql, params, session=statements.WORKER_SESSION)


def _unless_all(values: list[Any], default: object) -> list[Any]:
    """`values`, or no values when each is `default` (the statement puts it back)."""
    return [] if all(value == default for value in values) else values


def _write_orm(
    alias: str, worker: str, verdicts: Sequence[Verdict], repeats: Sequence[bool]
) -> set[AppliedRun]:
    applied: set[AppliedRun] = set()
    with transaction.atomic(using=alias):
        # SQLite's IMMEDIATE transactions serialise writers: no key lock to wait for.
        batch, folds = _folded(alias, verdicts, repeats, wait_for_keys=True)
        now = timezone.now()
        entries = []
        existing = set(
            Job.objects.using(alias)
            .filter(id__in=[v.job.id for v in batch])
            .values_list("id", flat=True)
        )
        with_dependents: list[int] = []
        for verdict, repeat in zip(batch, repeats, strict=True):
            if verdict.job.id not in existing:
                continue
            outcome, has_dependents = (None, False) if repeat else _apply(alias, verdict, now)
            if outcome is not None:
                applied.add((verdict.job.id, verdict.job.attempt))
            if has_dependents:
                with_dependents.append(verdict.job.id)
            entries.append(_entry(verdict, worker, now, outcome or JournalOutcome.DISCARDED))
        JournalEntry.objects.using(alias).bulk_create(entries)
        dedup.finish_folds(alias, folds)
        dependencies.resolve(alias, with_dependents)
    return applied


def _apply(alias: str, verdict: Verdict, now: datetime) -> tuple[JournalOutcome | None, bool]:
    """`_apply_orm`, and whether the job has dependents to resolve.

    A job claimed without dependents is written fenced by that too: no extra query
    unless one was enqueued after it while it ran (or the run lost its claim).
    """
    if not verdict.job.has_dependents:
        outcome = _apply_orm(alias, verdict, now, Q(dependents=0))
        if outcome is not None:
            return outcome, False
    outcome = _apply_orm(alias, verdict, now)
    return outcome, outcome is not None


def _apply_orm(
    alias: str, verdict: Verdict, now: datetime, fence: Q | None = None
) -> JournalOutcome | None:
    """Apply one verdict, fenced by its claim; the outcome to journal, or None if it was
    not applied (the run had lost its claim)."""
    changes: dict[str, object] = {
        "state": verdict.state,
        "failures": F("failures") + int(verdict.failed_run),
        "started_at": verdict.job.started_at,
        "claim_token": None,
        "lease_expires_at": None,
    }
    if verdict.state == State.READY:
        changes["run_at"] = now + verdict.delay
    if verdict.state in FINISHED_STATES:
        changes["finished_at"] = now
    if verdict.set_carry:
        changes["carry"] = verdict.carry
    if verdict.set_progress:
        changes["progress"] = verdict.progress
    if verdict.set_result:
        changes["result"] = verdict.result
    if verdict.error.type:
        changes["last_error"] = f"{verdict.error.type}: {verdict.error.message}"
        changes["error_type"] = verdict.error.type
    fenced = Job.objects.using(alias).filter(
        fence or Q(), id=verdict.job.id, claim_token=verdict.job.claim_token, state=State.RUNNING
    )
    if verdict.state != State.READY:
        return verdict.outcome if fenced.update(**changes) else None
    # A cancel asked while the job ran turns a requeue into `cancelled`.
    if fenced.filter(cancel_requested_at__isnull=True).update(**changes):
        return verdict.outcome
    changes.update(state=State.CANCELLED, finished_at=now)
    return JournalOutcome.CANCELLED if fenced.update(**changes) else None


def _entry(verdict: Verdict, worker: str, now: datetime, outcome: JournalOutcome) -> JournalEntry:
    """The journal entry of a verdict, with the outcome it had."""
    return JournalEntry(
        job_id=verdict.job.id,
        attempt=verdict.job.attempt,
        worker=verdict.worker or worker,
        started_at=verdict.job.started_at,
        finished_at=now,
        outcome=outcome,
        error_type=verdict.error.type,
        error_message=verdict.error.message,
        traceback=verdict.error.traceback,
    )
