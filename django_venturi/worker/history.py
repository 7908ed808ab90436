"""The history writer: a worker's figures per minute, counted in memory, written every few seconds.

The results writer hands every batch of written verdicts to `record` (a few
dictionary updates per verdict, on its thread); this service's loop writes the
minutes counted so far with one upsert every `HISTORY_FLUSH_INTERVAL`, and once
more when the worker stops. A worker that crashes loses at most the figures of
its last seconds, never a job: the roll-ups are figures, the journal stays the
record. Once a minute the loop also offers to do the minute's chores (depth
sample, hour rows, pruning: `store/history.py`); one worker a minute does them.

A verdict counts in the minute it was written, by database time (its run has
just ended; after the database was away, the minute it came back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django_venturi.conf import venturi_settings
from django_venturi.models import HISTOGRAM_BUCKETS
from django_venturi.states import JournalOutcome, State
from django_venturi.store import history
from django_venturi.store.clock import database_time
from django_venturi.store.history import RUN_OFFSET, WAIT_OFFSET
from django_venturi.store.tallies import RETRYABLE
from django_venturi.store.verdicts import Verdict
from django_venturi.worker.supervision import DatabaseHealth, Service, Streak

MINUTES_OPEN = 3
"""How many of the latest minutes stay in memory (and are written again while they
change); older ones are written a last time and forgotten."""
CHORES_EVERY = timedelta(minutes=1)
COMPLETED = JournalOutcome.COMPLETED
FAILED = State.FAILED
RETRYABLE_OUTCOMES = frozenset(RETRYABLE)
LAST_BUCKET = HISTOGRAM_BUCKETS - 1


class MinuteFigures:
    """A worker's figures, per minute, queue and kind, not yet written for the last time.

    Minutes are whole minutes since the epoch, by database time: the host's clock
    plus `offset`, the database's lead on it, which the writer measures once a
    minute. A verdict counts in the minute it is written (its run has just ended),
    so the results writer reads the clock once per batch, not once per verdict:
    per verdict, counting is a few dictionary and list operations (writing
    roll-ups must not slow a drain).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._minutes: dict[tuple[int, str, str], list[int]] = {}
        self._changed: set[tuple[int, str, str]] = set()
        self._oldest_open = 0
        self.offset = 0.0
        """Seconds the database's clock is ahead of this host's."""

    def record(self, verdicts: Sequence[Verdict]) -> None:
        """Count these written verdicts (called by the results writer)."""
        minute = max(int((time.time() + self.offset) // 60), self._oldest_open)
        with self._lock:
            minutes, changed = self._minutes, self._changed
            figures: list[int] = []
            last: tuple[str, str] | None = None
            for verdict in verdicts:
                # Inlined (the columns of `store/tallies.py`, the buckets of
                # `history.bucket`): a call costs as much as the work. Enum members are
                # compared by identity: by value, a str enum costs several times more.
                duration = verdict.duration
                outcome = verdict.outcome
                if outcome is COMPLETED:
                    column = 0
                elif verdict.state is FAILED:
                    column = 1
                elif outcome in RETRYABLE_OUTCOMES:
                    column = 2
                elif duration is None:
                    continue
                else:
                    column = -1
                job = verdict.job
                if last is None or job.kind != last[1] or job.queue != last[0]:
                    last = (job.queue, job.kind)
                    key = (minute, job.queue, job.kind)
                    found = minutes.get(key)
                    if found is None:
                        found = minutes[key] = [0] * len(history.FIGURE_COLUMNS)
                    figures = found
                    changed.add(key)
                if column >= 0:
                    figures[column] += 1
                if duration is not None:
                    index = int(duration * 1000).bit_length() if duration > 0 else 0
                    figures[RUN_OFFSET + (index if index < LAST_BUCKET else LAST_BUCKET)] += 1
                    if job.run_at is not None:
                        waited = (job.started_at - job.run_at).total_seconds()
                        index = int(waited * 1000).bit_length() if waited > 0 else 0
                        figures[WAIT_OFFSET + (index if index < LAST_BUCKET else LAST_BUCKET)] += 1

    def take_changed(self) -> dict[history.MinuteKey, list[int]]:
        """The minutes that changed since the last call, with their figures so far; the
        minutes older than the latest `MINUTES_OPEN` are forgotten (written a last time)."""
        with self._lock:
            changed = {key: list(self._minutes[key]) for key in self._changed}
            self._changed.clear()
            starts = sorted({start for start, _, _ in self._minutes})
            if len(starts) > MINUTES_OPEN:
                self._oldest_open = starts[-MINUTES_OPEN]
                for key in [key for key in self._minutes if key[0] < self._oldest_open]:
                    del self._minutes[key]
        return {
            (datetime.fromtimestamp(minute * 60, UTC), queue, kind): figures
            for (minute, queue, kind), figures in changed.items()
        }

    def give_back(self, figures: dict[history.MinuteKey, list[int]]) -> None:
        """A write failed: these minutes are to be written again (if still open)."""
        keys = {(int(start.timestamp()) // 60, queue, kind) for start, queue, kind in figures}
        with self._lock:
            self._changed.update(key for key in keys if key in self._minutes)


class HistoryWriter(Service):
    """Writes the worker's minute figures every few seconds, and offers to do the chores."""

    name = "history"

    def __init__(self, *, alias: str, worker: str, health: DatabaseHealth) -> None:
        super().__init__()
        self.alias = alias
        self.worker = worker
        self.health = health
        self.figures = MinuteFigures()
        self.enabled = venturi_settings.HISTORY
        """`VENTURI["HISTORY"]`: off, the service counts nothing and its loop ends at once."""
        self.interval = venturi_settings.HISTORY_FLUSH_INTERVAL.total_seconds()
        self._stop = threading.Event()
        self._streak = Streak()
        self._next_chores: float | None = None
        """When to offer the next chores, by this host's clock."""

    def record(self, verdicts: Sequence[Verdict]) -> None:
        if self.enabled:
            self.figures.record(verdicts)

    def stop(self) -> None:
        """Write what is left and end."""
        self._stop.set()

    def loop(self) -> None:
        if not self.enabled:
            return
        while not self._stop.wait(self.interval):
            self.health.guarded(self.flush, what="writing history", streak=self._streak)
            self.health.guarded(self.chores, what="history chores", streak=self._streak)
        self.health.guarded(self.flush, what="writing history")

    def flush(self) -> None:
        changed = self.figures.take_changed()
        try:
            history.write_minutes(self.alias, self.worker, changed)
        except BaseException:
            self.figures.give_back(changed)
            raise

    def chores(self) -> None:
        """Once a minute, by database time: offer to sample the depth, derive hours, prune."""
        if self._next_chores is not None and time.time() < self._next_chores:
            return
        now = database_time(self.alias)
        self.figures.offset = now.timestamp() - time.time()
        history.minute_chores(self.alias, now)
        self._next_chores = (
            history.minute_of(now) + CHORES_EVERY
        ).timestamp() - self.figures.offset
