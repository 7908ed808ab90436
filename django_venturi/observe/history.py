"""The history the stats and per-kind pages draw: roll-ups read over a range, never the job table.

A range (1 h, 24 h, 7 d, 30 d) is a row of equal steps ending with the current
one. The last hour reads minute rows; the longer ranges read hour rows, and the
hours not derived yet (the current one, and the last one for two minutes) from
their minute rows. Percentiles come from the steps' summed histograms.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from django_venturi.models import HISTOGRAM_BUCKETS, HistoryRollup
from django_venturi.store import history
from django_venturi.store.clock import database_time


@dataclasses.dataclass(frozen=True)
class Range:
    """A range the pages offer: its name, its steps and which rows it reads."""

    name: str
    label: str
    step: timedelta
    steps: int
    span: str


RANGES = {
    r.name: r
    for r in (
        Range("1h", "1 hour", timedelta(minutes=1), 60, HistoryRollup.Span.MINUTE),
        Range("24h", "24 hours", timedelta(hours=1), 24, HistoryRollup.Span.HOUR),
        Range("7d", "7 days", timedelta(hours=4), 42, HistoryRollup.Span.HOUR),
        Range("30d", "30 days", timedelta(hours=12), 60, HistoryRollup.Span.HOUR),
    )
}
DEFAULT_RANGE = "1h"


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """One step of a range."""

    start: datetime
    completed: int
    failed: int
    retried: int
    ready: float | None
    """Ready jobs, the mean of the step's samples (None: no sample)."""
    waiting: float | None
    wait_p50: float | None
    """Seconds from due to start, for half the runs that started in the step."""
    wait_p95: float | None
    run_p50: float | None
    """Seconds the handler ran, for half the runs of the step."""
    run_p95: float | None


@dataclasses.dataclass(frozen=True)
class History:
    """A range's points, oldest first, and its totals."""

    range: Range
    queue: str | None
    kind: str | None
    points: list[Point]
    completed: int
    failed: int
    retried: int
    wait_p50: float | None
    wait_p95: float | None
    run_p50: float | None
    run_p95: float | None

    @property
    def failure_rate(self) -> float:
        """Failed jobs over completed and failed ones (0 when none finished)."""
        finished = self.completed + self.failed
        return self.failed / finished if finished else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "range": self.range.name,
            "queue": self.queue,
            "kind": self.kind,
            "step_seconds": self.range.step.total_seconds(),
            "completed": self.completed,
            "failed": self.failed,
            "retried": self.retried,
            "failure_rate": self.failure_rate,
            "wait_p50": self.wait_p50,
            "wait_p95": self.wait_p95,
            "run_p50": self.run_p50,
            "run_p95": self.run_p95,
            "points": [
                {**dataclasses.asdict(point), "start": point.start.isoformat()}
                for point in self.points
            ],
        }


def read_history(
    alias: str,
    range_name: str = DEFAULT_RANGE,
    *,
    queue: str | None = None,
    kind: str | None = None,
    now: datetime | None = None,
) -> History:
    """The range's figures for every queue and kind, or those of one queue or kind."""
    chosen = RANGES[range_name]
    now = now or database_time(alias, statement=True)
    last = _step_start(now, chosen.step)
    since = last - chosen.step * (chosen.steps - 1)
    until = last + chosen.step
    rows = _rows(alias, chosen, since, until, queue=queue, kind=kind)
    sums = {
        since + chosen.step * index: [0] * len(history.SUMMED_COLUMNS)
        for index in range(chosen.steps)
    }
    for start, values in rows.items():
        step = sums.get(since + chosen.step * ((start - since) // chosen.step))
        if step is not None:
            for index, value in enumerate(values):
                step[index] += value
    total = [sum(column) for column in zip(*sums.values(), strict=True)]
    points = [_point(start, values) for start, values in sums.items()]
    summary = _point(since, total)
    return History(
        range=chosen,
        queue=queue,
        kind=kind,
        points=points,
        completed=summary.completed,
        failed=summary.failed,
        retried=summary.retried,
        wait_p50=summary.wait_p50,
        wait_p95=summary.wait_p95,
        run_p50=summary.run_p50,
        run_p95=summary.run_p95,
    )


def _step_start(moment: datetime, step: timedelta) -> datetime:
    """The start of the step holding `moment` (steps are whole units of the day, in UTC)."""
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return day + step * ((moment - day) // step)


def _rows(
    alias: str,
    chosen: Range,
    since: datetime,
    until: datetime,
    *,
    queue: str | None,
    kind: str | None,
) -> dict[datetime, list[int]]:
    """The summed rows of [since, until): hour rows, and minute rows for the hours not
    derived yet (or minute rows alone for the minute range)."""
    if chosen.span == HistoryRollup.Span.MINUTE:
        return history.summed(
            alias, span=chosen.span, since=since, until=until, queue=queue, kind=kind
        )
    hours = history.summed(
        alias, span=chosen.span, since=since, until=until, queue=queue, kind=kind
    )
    derived = history.last_derived_hour(alias, since)
    from_minutes = since if derived is None else derived + timedelta(hours=1)
    minutes = history.summed(
        alias,
        span=HistoryRollup.Span.MINUTE,
        since=max(from_minutes, until - history.MINUTES_KEPT),
        until=until,
        queue=queue,
        kind=kind,
    )
    for start, values in minutes.items():
        hour = hours.setdefault(history.hour_of(start), [0] * len(values))
        for index, value in enumerate(values):
            hour[index] += value
    return hours


def _point(start: datetime, values: list[int]) -> Point:
    columns = dict(zip(history.SUMMED_COLUMNS, values, strict=True))
    wait = values[history.WAIT_OFFSET : history.WAIT_OFFSET + HISTOGRAM_BUCKETS]
    run = values[history.RUN_OFFSET : history.RUN_OFFSET + HISTOGRAM_BUCKETS]
    samples = columns["samples"]
    return Point(
        start=start,
        completed=columns["completed"],
        failed=columns["failed"],
        retried=columns["retried"],
        ready=columns["ready"] / samples if samples else None,
        waiting=columns["waiting"] / samples if samples else None,
        wait_p50=history.percentile(wait, 0.5),
        wait_p95=history.percentile(wait, 0.95),
        run_p50=history.percentile(run, 0.5),
        run_p95=history.percentile(run, 0.95),
    )
