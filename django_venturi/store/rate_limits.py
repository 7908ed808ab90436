"""Rate limits: at most N starts of a kind (or of each value of a payload field) in
any window of a given length, across every worker and host.

The database keeps the count. Each claim that starts jobs of a limited kind
writes one `RateStart` row per job, in the claim's own statement, and counts
the rows inside each limit's window before it chooses (`claim_statement.py`).
Claims of limited kinds take the claims' advisory lock first, so that no two
claims count the same window at once: the limit is exact, not approximate.

Just before a limited job's handler starts, its worker moves the recorded
start to that moment (`rate_starts.py`), so the limit holds as the handlers see
it, not only in the database. A start is counted for `per` plus a small guard,
which covers the moment between that move and the handler's first line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django_venturi.store.concurrency import field_text

GUARD = timedelta(milliseconds=50)
"""The most a start is counted beyond its window."""
GUARD_SHARE = 0.05
"""...and never more than this share of the window."""


@dataclasses.dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `limit` starts of a task in any window of length `per`, across all workers.

    With `key`, the limit holds for each value of that payload field apart
    (each account gets its own `limit`). A retry counts as a start; jobs over
    the limit stay ready, without a failed attempt.
    """

    limit: int
    per: timedelta
    key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 1:
            raise ValueError(f"RateLimit limit must be a positive int, got {self.limit!r}")
        if not isinstance(self.per, timedelta) or self.per <= timedelta(0):
            raise ValueError(f"RateLimit per must be a positive timedelta, got {self.per!r}")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ValueError(f"RateLimit key must be a payload field's name, got {self.key!r}")

    @property
    def guard_seconds(self) -> float:
        """How late after its claim a limited job may start."""
        return min(GUARD.total_seconds(), self.per.total_seconds() * GUARD_SHARE)

    @property
    def window_seconds(self) -> float:
        """How long one start counts against the limit, guard included."""
        return self.per.total_seconds() + self.guard_seconds

    def describe(self) -> str:
        """`50 per 1s`, `5 per 1s per account_id`."""
        text = f"{self.limit} per {_duration(self.per)}"
        return text if self.key is None else f"{text} per {self.key}"


@dataclasses.dataclass(frozen=True, slots=True)
class RateRule:
    """A kind's rate limit, as a claim applies it."""

    kind: str
    limit: RateLimit


def key_value(limit: RateLimit, payload: Mapping[str, Any] | Any) -> str:
    """The key a job's start counts under: the field's value as text ("" without a key)."""
    return field_text(limit.key, payload)


def next_opening(starts: Iterable[datetime], limit: RateLimit, now: datetime) -> datetime | None:
    """When a start fits under `limit` again, given the starts counted now (None: now)."""
    window = timedelta(seconds=limit.window_seconds)
    counted = sorted(start for start in starts if start > now - window)
    if len(counted) < limit.limit:
        return None
    # The oldest starts leave the window first; one must leave for each start over.
    return counted[len(counted) - limit.limit] + window


def _duration(per: timedelta) -> str:
    seconds = per.total_seconds()
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
