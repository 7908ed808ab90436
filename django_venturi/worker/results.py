"""The results writer: one thread that writes the verdicts of a worker's runs.

Verdicts are written in batches (group commit) on the writer's own connection,
so handlers never wait for the database and heartbeats never wait for
verdicts. The writer also writes the throttled `ctx.progress()` of running
jobs.

Nothing a verdict holds may stop the writer. A batch the database refuses
for a reason of its own (a value it cannot store, a constraint, a trigger, a
deadlock that keeps coming back) is written verdict by verdict, so that one bad
verdict never blocks the others; a verdict refused on its own is replaced by a
failed run that says why, and if even that is refused it is left for lease
recovery (the job runs again: at-least-once).

A refusal that is the database's state, not the verdict's, never changes an
outcome: while the database is away, or takes no writes (read-only after a
failover, shutting down: `connections.refuses_writes`), the verdicts stay in
memory and are written when a connection may write again. A write that failed
on the connection may have been applied all the same (its answer lost): before
writing those runs again, the writer looks in the journal (`lost_answers.py`),
so that an applied verdict is logged and signalled once, as what it was.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from django import db

from django_venturi import signals
from django_venturi.states import JournalOutcome
from django_venturi.store import lost_answers, progress, statements
from django_venturi.store import verdicts as verdicts_module
from django_venturi.store.claim import RunKey
from django_venturi.store.completion import AppliedRun, write_runs
from django_venturi.store.connections import DATABASE_ERRORS, unavailable
from django_venturi.store.key_locks import KeysBusy
from django_venturi.store.verdicts import ErrorInfo, Verdict
from django_venturi.worker.liveness import RESULTS_WRITER, Progress
from django_venturi.worker.log import batched_lines
from django_venturi.worker.run_events import RunEvents
from django_venturi.worker.runs import Runs
from django_venturi.worker.supervision import DatabaseHealth, Service, Streak

logger = logging.getLogger("django_venturi.worker")

BATCH = 500
"""Most verdicts per write."""
CLOSING_POLL = 0.02
"""While closing: how often to look whether every held run's verdict has come."""
KEY_WAIT_RETRY = 0.1
"""Seconds before a verdict held back for a busy dedup key is tried again."""
TRANSIENT_TRIES = 3
"""A batch failing this many times in a row with the database up is written one by one;
a verdict failing alone this many times (a deadlock, a lock timeout) is replaced."""


class ResultsWriter(Service):
    name = "results"

    def __init__(
        self,
        *,
        alias: str,
        runs: Runs,
        health: DatabaseHealth,
        events: RunEvents,
        force: threading.Event,
        on_written: Callable[[Sequence[Verdict]], None],
        progress: Progress | None = None,
    ) -> None:
        super().__init__()
        self.progress = progress or Progress()
        self.alias = alias
        self.runs = runs
        self.health = health
        self.events = events
        self.processed = 0
        self._force = force
        self._on_written = on_written
        self._queue: queue.SimpleQueue[Verdict | None] = queue.SimpleQueue()
        self._pending: list[Verdict] = []
        self._closing = False
        self._streak = Streak()
        self._transient: dict[RunKey, int] = {}
        """Runs whose lone write failed with a database error that may pass: how often."""
        self._unanswered: set[RunKey] = set()
        self._waiting_for_keys: list[Verdict] = []
        """Verdicts held back: their dedup key is held by another session's transaction."""
        self._keys_retry_at = 0.0
        """Runs whose last write failed on the connection: applied or not, nobody said."""

    # ------------------------------------------------------------ other threads

    def submit(self, verdict: Verdict) -> None:
        self._queue.put(verdict)

    def close(self) -> None:
        """End once every run the worker holds has its verdict written (or when forced)."""
        self._queue.put(None)

    # ------------------------------------------------------------ the loop

    def loop(self) -> None:
        """Write until closed and every held run's verdict is written (or forced)."""
        with self.progress.watching(RESULTS_WRITER):
            self._loop()

    def _loop(self) -> None:
        next_progress = time.monotonic() + progress.PROGRESS_INTERVAL
        while True:
            self.progress.working(RESULTS_WRITER)
            if time.monotonic() >= next_progress:
                self._flush_progress()
                next_progress = time.monotonic() + progress.PROGRESS_INTERVAL
            self._retry_waiting_for_keys()
            if not self._pending:
                if self._closing and (self.runs.idle() or self._force.is_set()):
                    self._give_up_on_waiting_for_keys()
                    return
                wait = CLOSING_POLL if self._closing else next_progress - time.monotonic()
                if self._waiting_for_keys:
                    wait = min(wait, self._keys_retry_at - time.monotonic())
                self.progress.waiting(RESULTS_WRITER)
                if not self._take(wait):
                    continue
                self.progress.working(RESULTS_WRITER)
            self._take_waiting()
            if self._write(self._pending):
                self._pending = []
            elif self._closing and self._force.is_set():
                self._give_up_on_pending()
            else:
                self.progress.waiting(RESULTS_WRITER)
                time.sleep(self.health.delay(self._streak.count))

    def _take(self, timeout: float) -> bool:
        """Wait for a verdict; False if none came (or the end marker did)."""
        try:
            first = self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return False
        if first is None:
            self._closing = True
            return False
        self._pending.append(first)
        return True

    def _take_waiting(self) -> None:
        while len(self._pending) < BATCH:
            try:
                verdict = self._queue.get_nowait()
            except queue.Empty:
                return
            if verdict is None:
                self._closing = True
                return
            self._pending.append(verdict)

    def _retry_waiting_for_keys(self) -> None:
        if self._waiting_for_keys and time.monotonic() >= self._keys_retry_at:
            self._pending.extend(self._waiting_for_keys)
            self._waiting_for_keys = []

    def _give_up_on_waiting_for_keys(self) -> None:
        if not self._waiting_for_keys:
            return
        logger.error(
            "worker %s exits without writing %d verdicts whose dedup key another session "
            "held: their leases will expire and other workers will run those jobs again",
            self.events.worker,
            len(self._waiting_for_keys),
            extra={"worker": self.events.worker},
        )
        self._waiting_for_keys = []

    def _give_up_on_pending(self) -> None:
        logger.error(
            "worker %s exits without writing %d verdicts: their leases will expire "
            "and other workers will run those jobs again",
            self.events.worker,
            len(self._pending),
            extra={"worker": self.events.worker},
        )
        self.runs.written(verdict.job for verdict in self._pending)
        self._pending = []

    # ------------------------------------------------------------ writing

    def _write(self, pending: list[Verdict]) -> bool:
        """Write the batch; False if it must be tried again (the database is away)."""
        try:
            pending = self._settle_unanswered(pending)
            pending, applied = self._write_runs(pending)
        except Exception as error:
            self._note_unanswered(self._pending, error)
            self._streak.count += 1
            self.health.failed(error, what="writing results", repeated=self._streak.count > 1)
            if self.health.is_down or not self._write_one_by_one_now(error):
                return False
            return self._write_each(self._pending)
        self._streak.count = 0
        self.health.back()
        self._unanswered.difference_update(verdict.job.run_key for verdict in pending)
        self._written(pending, applied)
        return True

    def _write_runs(self, verdicts: list[Verdict]) -> tuple[list[Verdict], set[AppliedRun]]:
        """Write the verdicts, holding back those whose dedup key another session holds
        (`KeysBusy`); return the verdicts written and the runs applied. What is left to
        write is `self._pending` all along, so that a failure writes one by one only that."""
        with statements.own_transactions_bounded(self.alias):
            while verdicts:
                try:
                    return verdicts, write_runs(
                        self.alias, self.events.worker, verdicts, wait_for_keys=False
                    )
                except KeysBusy as busy:
                    if not busy.verdicts:
                        raise  # nothing to hold back: never loop on it
                    self._hold_back(busy.verdicts)
                    held = {id(verdict) for verdict in busy.verdicts}
                    verdicts = [verdict for verdict in verdicts if id(verdict) not in held]
                    self._pending = verdicts
        return [], set()

    def _hold_back(self, verdicts: Sequence[Verdict]) -> None:
        """Try these again in KEY_WAIT_RETRY seconds: a producer's transaction holds their
        key. Their runs stay held (the heartbeat keeps their leases)."""
        if not self._waiting_for_keys:
            self._keys_retry_at = time.monotonic() + KEY_WAIT_RETRY
        self._waiting_for_keys.extend(verdicts)

    def _note_unanswered(self, verdicts: Sequence[Verdict], error: Exception) -> None:
        """After a failed write: if the connection failed, nobody knows what it applied."""
        if unavailable(error):
            self._unanswered.update(verdict.job.run_key for verdict in verdicts)

    def _doubtful(self, verdict: Verdict) -> bool:
        """Whether an earlier write of this run may have been applied."""
        return verdict.if_unapplied is not None or verdict.job.run_key in self._unanswered

    def _settle_unanswered(self, pending: list[Verdict]) -> list[Verdict]:
        """Before writing again what may have been applied: report the runs that were (as
        the journal says), and return what is left to write, with an atomic run that was
        not applied replaced by its `if_unapplied` verdict."""
        doubtful = [self._doubtful(verdict) for verdict in pending]
        if not any(doubtful):
            return pending
        outcomes = lost_answers.applied_outcomes(
            self.alias,
            [
                (v.job.id, v.job.attempt)
                for v, doubt in zip(pending, doubtful, strict=True)
                if doubt
            ],
        )
        settled: list[Verdict] = []
        left: list[Verdict] = []
        for verdict, doubt in zip(pending, doubtful, strict=True):
            outcome = outcomes.get((verdict.job.id, verdict.job.attempt)) if doubt else None
            if outcome is not None:
                settled.append(as_applied(verdict, outcome))
            else:
                left.append(verdict.if_unapplied or verdict)
        self._unanswered.difference_update(verdict.job.run_key for verdict in settled)
        if settled:
            logger.warning(
                "worker %s: %d verdicts were written before the connection broke (their "
                "answer was lost); found in the journal, not written again",
                self.events.worker,
                len(settled),
                extra={"worker": self.events.worker},
            )
        self._written(settled, {(verdict.job.id, verdict.job.attempt) for verdict in settled})
        self._pending = left
        return left

    def _write_one_by_one_now(self, error: Exception) -> bool:
        """A transient error (deadlock, lock timeout) gets a few more tries as a batch."""
        transient = isinstance(error, DATABASE_ERRORS)
        return not transient or self._streak.count >= TRANSIENT_TRIES

    def _write_each(self, pending: list[Verdict]) -> bool:
        """Isolate the verdicts the database refuses; False if any must be tried again."""
        done: list[Verdict] = []
        again: list[Verdict] = []
        applied: set[AppliedRun] = set()
        for index, verdict in enumerate(pending):
            try:
                alone = self._write_alone(verdict)
            except Exception as error:
                if not unavailable(error):
                    raise
                if self.health.is_down:
                    again.extend(pending[index:])
                    break
                again.append(verdict)  # transient (a lock, a deadlock): tried again soon
                continue
            if alone is not None:  # None: held back for its dedup key
                applied |= alone
                done.append(verdict)
        self._written(done, applied)
        self._pending = again
        if not again:
            self._streak.count = 0
        return not again

    def _write_alone(self, verdict: Verdict) -> set[AppliedRun] | None:
        """Write one verdict; replace it by a failed run if the database refuses it. None
        if it was held back for its dedup key (`_hold_back`).

        Raises a database error that may pass (the database is away, a lock or
        deadlock that has not yet recurred TRANSIENT_TRIES times for this run).
        """
        try:
            written, applied = self._write_runs([verdict])
            if not written:
                return None
        except Exception as error:
            if self._may_pass(verdict, error):
                raise
            refused = error
        else:
            self._transient.pop(verdict.job.run_key, None)
            return applied
        self._transient.pop(verdict.job.run_key, None)
        replacement = unwritable(verdict, refused)
        logger.error(
            "job %d: the database refused the verdict of attempt %d (%s: %s); "
            "writing a failed run instead",
            verdict.job.id,
            verdict.job.attempt,
            type(refused).__name__,
            refused,
            extra=self.events.log_extra(verdict.job, JournalOutcome.FAILED),
        )
        try:
            return write_runs(self.alias, self.events.worker, [replacement])
        except Exception as error:
            if unavailable(error) and self._database_away(error):
                raise
            logger.critical(
                "job %d: the database refused even a failed run (%s: %s); its lease will "
                "expire and the job will run again",
                verdict.job.id,
                type(error).__name__,
                error,
                extra=self.events.log_extra(verdict.job, JournalOutcome.DISCARDED),
            )
            return set()

    def _may_pass(self, verdict: Verdict, error: Exception) -> bool:
        """Whether a failed write is worth trying again rather than replacing the verdict."""
        if not unavailable(error):
            db.close_old_connections()
            return False
        if self._database_away(error):
            return True
        key = verdict.job.run_key
        self._transient[key] = self._transient.get(key, 0) + 1
        return self._transient[key] < TRANSIENT_TRIES

    def _database_away(self, error: Exception) -> bool:
        self.health.failed(error, what="writing a result")
        return self.health.is_down

    def _written(self, written: Sequence[Verdict], applied: set[AppliedRun]) -> None:
        """After a write: the log, signals, follow-ups, and the runs are held no more.

        The log records of a batch are made here, in one thread, not by the handler
        threads: many threads taking turns on a logging handler's lock cost a third
        of the throughput at the default verbosity."""
        with batched_lines():
            for verdict in written:
                if verdict.outcome != JournalOutcome.RELEASED:  # `Handlers.release` logs those
                    self.events.verdict(verdict)
        for verdict in written if self.events.listened(signals.job_finished) else ():
            was_applied = (verdict.job.id, verdict.job.attempt) in applied
            self.events.send(
                signals.job_finished,
                job_id=verdict.job.id,
                kind=verdict.job.kind,
                queue=verdict.job.queue,
                attempt=verdict.job.attempt,
                worker=self.events.worker,
                outcome=verdict.outcome if was_applied else JournalOutcome.DISCARDED,
                duration=verdict.duration,
                error_type=verdict.error.type,
            )
        for verdict in written:
            if verdict.after_write is not None:
                self._after_write(verdict, (verdict.job.id, verdict.job.attempt) in applied)
        self.runs.written(verdict.job for verdict in written)
        self.processed += len(written)
        self._on_written(written)

    def _after_write(self, verdict: Verdict, applied: bool) -> None:
        """Run a verdict's follow-up (Django Tasks' `task_finished`); log, never raise."""
        assert verdict.after_write is not None
        try:
            verdict.after_write(applied)
        except Exception:
            logger.exception(
                "follow-up of job %d failed",
                verdict.job.id,
                extra=self.events.log_extra(verdict.job, verdict.outcome),
            )

    # ------------------------------------------------------------ progress

    def _flush_progress(self) -> None:
        """Write the progress that changed since the last flush."""
        updates = []
        for execution in self.runs.held():
            dirty, value = execution.take_progress()
            if dirty:
                updates.append((execution.job, value))
        if updates:
            self.health.guarded(
                lambda: progress.write_progress(self.alias, updates),
                what="writing progress",
            )


def as_applied(verdict: Verdict, outcome: str) -> Verdict:
    """A verdict found applied by an earlier write, with the outcome its journal entry
    says (the worker logs and signals that), and nothing more to write."""
    return dataclasses.replace(
        verdict, outcome=JournalOutcome(outcome), written=True, if_unapplied=None
    )


def unwritable(verdict: Verdict, error: Exception) -> Verdict:
    """The failed run that replaces a verdict the database refused."""
    reason = (
        f"the worker could not store this run's verdict ({verdict.outcome}): "
        f"{error!r}"  # repr: no NUL or lone surrogate gets through
    )
    failed = verdicts_module.failed(
        verdict.job, ErrorInfo.from_reason(reason, type="django_venturi.UnwritableVerdict")
    )
    return dataclasses.replace(failed, worker=verdict.worker, duration=verdict.duration)
