"""History roll-ups: the statements that write, derive, prune and read `HistoryRollup` rows.

Workers count their runs in memory (`worker/history.py`) and write them here,
one row per worker, minute, queue and kind, upserted with the minute's figures
so far (a row is only ever set to a larger figure: the same minute written
twice is the same row). Once a minute one worker wins the minute's marker row
(queue and kind empty) and does the chores: it samples the queue depth (the live
jobs' counts, from the partial indexes that cover them), derives the hour rows
of every finished hour that has none, and prunes what is past keeping. The
pages read only this table, never the job table.

Times are kept as histograms of fixed log-scale buckets (`models.WAIT_COLUMNS`,
`models.RUN_COLUMNS`): they add up across workers and intervals, so a
percentile of any stretch comes from summed buckets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from django.db import IntegrityError, connections, transaction
from django.db.models import Count, Field, Sum

from django_venturi.models import (
    HISTOGRAM_BUCKETS,
    RUN_COLUMNS,
    WAIT_COLUMNS,
    HistoryRollup,
    Job,
)
from django_venturi.states import State

MINUTES_KEPT = timedelta(hours=25)
"""Minute rows older than this are pruned (the 24-hour range reads hour rows)."""
HOURS_KEPT = timedelta(days=31)
"""Hour rows older than this are pruned (the 30-day range and one day to spare)."""
HOUR_SETTLES = timedelta(minutes=2)
"""An hour is derived this long after it ended: its last minute's rows are written by then."""
COUNT_COLUMNS = ("completed", "failed", "retried")
FIGURE_COLUMNS = (*COUNT_COLUMNS, *WAIT_COLUMNS, *RUN_COLUMNS)
"""A worker's figures of one minute, in the order of `Figures`' list."""
SUMMED_COLUMNS = (*FIGURE_COLUMNS, "ready", "waiting", "samples")
WAIT_OFFSET = len(COUNT_COLUMNS)
RUN_OFFSET = WAIT_OFFSET + HISTOGRAM_BUCKETS

MinuteKey = tuple[datetime, str, str]
"""A minute's start, the queue, the kind."""


def bucket(seconds: float) -> int:
    """The histogram bucket of a time: 0 under 1 ms, i for [2^(i-1), 2^i) ms, the last
    one for anything longer."""
    return min(int(max(seconds, 0.0) * 1000).bit_length(), HISTOGRAM_BUCKETS - 1)


def bucket_bounds(index: int) -> tuple[float, float]:
    """The bucket's lower and upper bound in seconds (the last one's upper bound is
    twice its lower one: a percentile there says "at least")."""
    if index == 0:
        return 0.0, 0.001
    low = 2.0 ** (index - 1) / 1000
    return low, low * 2


def percentile(buckets: Sequence[int], fraction: float) -> float | None:
    """The time below which `fraction` of the counted times fall, in seconds, read off
    summed buckets (interpolated within its bucket); None when nothing was counted."""
    total = sum(buckets)
    if not total:
        return None
    rank = fraction * total
    seen = 0
    for index, count in enumerate(buckets):
        if count and seen + count >= rank:
            low, high = bucket_bounds(index)
            return low + (high - low) * max(rank - seen, 0) / count
        seen += count
    return bucket_bounds(len(buckets) - 1)[1]  # pragma: no cover - rank <= total


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


# ------------------------------------------------------------------ writing


def write_minutes(alias: str, worker: str, figures: Mapping[MinuteKey, Sequence[int]]) -> None:
    """Upsert this worker's rows of these minutes with their figures so far: one statement."""
    rows = [
        HistoryRollup(
            span=HistoryRollup.Span.MINUTE,
            start=start,
            queue=queue,
            kind=kind,
            worker=worker,
            **dict(zip(FIGURE_COLUMNS, values, strict=True)),
        )
        for (start, queue, kind), values in figures.items()
    ]
    if not rows:
        return
    # MariaDB and MySQL upsert on any unique key and take no conflict target.
    targeted = connections[alias].features.supports_update_conflicts_with_target
    HistoryRollup.objects.using(alias).bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["span", "start", "queue", "kind", "worker"] if targeted else None,
        update_fields=list(FIGURE_COLUMNS),
    )


def take_minute(alias: str, minute: datetime) -> bool:
    """Write the minute's marker row; True for the one caller that wrote it (it samples
    the depth and does the chores for that minute)."""
    try:
        with transaction.atomic(using=alias):
            HistoryRollup.objects.using(alias).create(
                span=HistoryRollup.Span.MINUTE, start=minute, samples=1
            )
    except IntegrityError:
        return False
    return True


def sample_depth(alias: str, minute: datetime) -> int:
    """Write the minute's depth rows (ready and waiting jobs per queue and kind) from the
    live jobs' counts; return the rows written."""
    depth: dict[tuple[str, str], dict[str, int]] = {}
    counts = (
        Job.objects.using(alias)
        .filter(state__in=[State.READY, State.WAITING])
        .values_list("queue", "kind", "state")
        .annotate(jobs=Count("id"))
        .order_by()
    )
    for queue, kind, state, jobs in counts:
        depth.setdefault((queue, kind), {"ready": 0, "waiting": 0})[state] = jobs
    rows = [
        HistoryRollup(span=HistoryRollup.Span.MINUTE, start=minute, queue=q, kind=k, **figures)
        for (q, k), figures in depth.items()
    ]
    HistoryRollup.objects.using(alias).bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def hours_to_derive(alias: str, now: datetime) -> list[datetime]:
    """Finished, settled hours of the kept minutes that have no hour rows yet."""
    until = hour_of(now - HOUR_SETTLES)
    markers = HistoryRollup.objects.using(alias).filter(queue="", kind="", worker="")
    sampled = {
        hour_of(start)
        for start in markers.filter(
            span=HistoryRollup.Span.MINUTE, start__gte=now - MINUTES_KEPT, start__lt=until
        ).values_list("start", flat=True)
    }
    derived = set(
        markers.filter(span=HistoryRollup.Span.HOUR, start__gte=now - MINUTES_KEPT).values_list(
            "start", flat=True
        )
    )
    return sorted(sampled - derived)


def derive_hour(alias: str, hour: datetime) -> int:
    """Write the hour rows of `hour`, summed from its minute rows (every worker's, and the
    depth samples): one per queue and kind, one per queue without a kind (the queue's
    totals), and the marker row, which holds the totals of everything and the samples
    (so that a range of every queue and kind reads one row an hour). Return the rows
    written."""
    sums = (
        HistoryRollup.objects.using(alias)
        .filter(
            span=HistoryRollup.Span.MINUTE, start__gte=hour, start__lt=hour + timedelta(hours=1)
        )
        .values_list("queue", "kind")
        .annotate(**{column: Sum(column) for column in SUMMED_COLUMNS})
        .order_by()
    )
    totals: dict[tuple[str, str], list[int]] = {("", ""): [0] * len(SUMMED_COLUMNS)}
    rows = []
    for queue, kind, *values in sums:
        whole = _whole(values)
        if kind:
            rows.append(HistoryRollup(span="hour", start=hour, queue=queue, kind=kind, **whole))
        for key in ((queue, ""), ("", "")) if kind else (("", ""),):
            into = totals.setdefault(key, [0] * len(SUMMED_COLUMNS))
            for index, column in enumerate(SUMMED_COLUMNS):
                into[index] += whole[column]
    for (queue, _), values in totals.items():
        whole = _whole(values)
        if queue:
            whole["samples"] = 0  # the samples are the marker's
        rows.append(HistoryRollup(span="hour", start=hour, queue=queue, **whole))
    HistoryRollup.objects.using(alias).bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def _whole(values: Sequence[int | None]) -> dict[str, int]:
    return {column: int(value or 0) for column, value in zip(SUMMED_COLUMNS, values, strict=True)}


def prune(alias: str, now: datetime) -> int:
    """Delete minute rows past `MINUTES_KEPT` and hour rows past `HOURS_KEPT`."""
    rollups = HistoryRollup.objects.using(alias)
    minutes, _ = rollups.filter(
        span=HistoryRollup.Span.MINUTE, start__lt=now - MINUTES_KEPT
    ).delete()
    hours, _ = rollups.filter(span=HistoryRollup.Span.HOUR, start__lt=now - HOURS_KEPT).delete()
    return minutes + hours


def minute_chores(alias: str, now: datetime) -> bool:
    """If no other worker did yet: sample this minute's depth, derive the settled hours
    and prune. True if this caller did them."""
    if not take_minute(alias, minute_of(now)):
        return False
    sample_depth(alias, minute_of(now))
    for hour in hours_to_derive(alias, now):
        derive_hour(alias, hour)
    prune(alias, now)
    return True


# ------------------------------------------------------------------ reading


def summed(
    alias: str,
    *,
    span: str,
    since: datetime,
    until: datetime,
    queue: str | None = None,
    kind: str | None = None,
) -> dict[datetime, list[int]]:
    """Per interval start in [since, until): the `SUMMED_COLUMNS` of the matching rows
    summed (the depth samples are the marker rows', whatever the filters). Hours of every
    kind read the totals rows `derive_hour` wrote, one per hour (and queue)."""
    rows = HistoryRollup.objects.using(alias).filter(span=span, start__gte=since, start__lt=until)
    if span == HistoryRollup.Span.HOUR and kind is None:
        figures = rows.filter(kind="", queue=queue or "")
    else:
        figures = rows.exclude(kind="")  # no marker, no totals
        if queue is not None:
            figures = figures.filter(queue=queue)
        if kind is not None:
            figures = figures.filter(kind=kind)
    by_start: dict[datetime, list[int]] = {}
    for start, *values in (
        figures.values_list("start")
        .annotate(**{column: _raw_sum(column) for column in SUMMED_COLUMNS[:-1]})
        .order_by()
    ):
        by_start[start] = [int(value or 0) for value in values] + [0]
    for start, samples in rows.filter(queue="", kind="").values_list("start", "samples"):
        by_start.setdefault(start, [0] * len(SUMMED_COLUMNS))[-1] += samples
    return by_start


def _raw_sum(column: str) -> Sum:
    """SUM(column) as the database returns it: an output field without a converter (the
    int converter of an integer field was a third of the 30-day range's time; `summed`
    makes each value an int itself)."""
    return Sum(column, output_field=Field())


def recent_queues(alias: str, until: datetime) -> set[str]:
    """The queues with minute rows in the hour before `until` (the page's filter links)."""
    return set(
        HistoryRollup.objects.using(alias)
        .filter(span=HistoryRollup.Span.MINUTE, start__gte=until - timedelta(hours=1))
        .exclude(queue="")
        .values_list("queue", flat=True)
        .distinct()
    )


def last_derived_hour(alias: str, since: datetime) -> datetime | None:
    """The start of the latest hour with hour rows, from `since` on (None: none)."""
    starts: Iterable[datetime] = (
        HistoryRollup.objects.using(alias)
        .filter(span=HistoryRollup.Span.HOUR, queue="", kind="", worker="", start__gte=since)
        .order_by("-start")
        .values_list("start", flat=True)[:1]
    )
    return next(iter(starts), None)
