"""The history writer: a worker's figures per minute, counted in memory, written every few seconds.

The results writer hands every batch of written verdicts to `record` (a few
dictionary updates per verdict, on its thread); this service's loop writes the
minutes counted so far with one upsert every `HISTORY_FLUSH_INTERVAL`, and once
more when the worker stops. A worker that crashes loses at most the figures of
its last seconds, never a job: the roll-ups are figures, the journal stays the
record. Once a minute the loop also offers to do the minute's chores (depth
sample, hour rows, pruning: `store/history.py`); one worker a minute does them.

A verdict's minute is its run's end by database time (the claim's time, plus the
wait before the handler started, plus the run). A verdict of a minute already
written for the last time (the database was away for minutes) counts in the
oldest minute still open.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta

from django_venturi.conf import venturi_settings
from django_venturi.states import JournalOutcome, State
from django_venturi.store import history
from django_venturi.store.clock import database_time
from django_venturi.store.tallies import RETRYABLE
from django_venturi.store.verdicts import Verdict
from django_venturi.worker.supervision import DatabaseHealth, Service, Streak

MINUTES_OPEN = 3
"""How many of the latest minutes stay in memory (and are written again while they
change); older ones are written a last time and forgotten."""
CHORES_EVERY = timedelta(minutes=1)


class MinuteFigures:
    """A worker's figures, per minute, queue and kind, not yet written for the last time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._minutes: dict[history.MinuteKey, list[int]] = {}
        self._changed: set[history.MinuteKey] = set()
        self._oldest_open: datetime | None = None

    def record(self, verdicts: Sequence[Verdict]) -> None:
        """Count these written verdicts (called by the results writer)."""
        with self._lock:
            for verdict in verdicts:
                self._count(verdict)

    def _count(self, verdict: Verdict) -> None:
        column = _column(verdict)
        if column is None and verdict.duration is None:
            return
        job = verdict.job
        ended = job.started_at + timedelta(seconds=verdict.duration or 0.0)
        minute = history.minute_of(ended)
        if self._oldest_open is not None and minute < self._oldest_open:
            minute = self._oldest_open
        key = (minute, job.queue, job.kind)
        figures = self._minutes.get(key)
        if figures is None:
            figures = self._minutes[key] = [0] * len(history.FIGURE_COLUMNS)
        self._changed.add(key)
        if column is not None:
            figures[column] += 1
        if verdict.duration is not None:
            figures[history.RUN_OFFSET + history.bucket(verdict.duration)] += 1
            if job.run_at is not None:
                waited = (job.started_at - job.run_at).total_seconds()
                figures[history.WAIT_OFFSET + history.bucket(waited)] += 1

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
        return changed

    def give_back(self, figures: dict[history.MinuteKey, list[int]]) -> None:
        """A write failed: these minutes are to be written again (if still open)."""
        with self._lock:
            self._changed.update(key for key in figures if key in self._minutes)


def _column(verdict: Verdict) -> int | None:
    """Which count a verdict adds to (as `store/tallies.py` counts the journal)."""
    if verdict.outcome == JournalOutcome.COMPLETED:
        return 0
    if verdict.state == State.FAILED:
        return 1
    if verdict.outcome in RETRYABLE:
        return 2
    return None


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
        self._next_chores: datetime | None = None

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
        now = database_time(self.alias)
        if self._next_chores is not None and now < self._next_chores:
            return
        history.minute_chores(self.alias, now)
        self._next_chores = history.minute_of(now) + CHORES_EVERY
