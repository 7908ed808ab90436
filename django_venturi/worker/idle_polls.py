"""How long an idle worker waits before it looks for due jobs again, where nothing wakes it.

PostgreSQL wakes workers with LISTEN/NOTIFY, and they poll at `POLL_INTERVAL` only as a
fallback. SQLite, MariaDB and MySQL have no such thing: their workers poll. Right after
jobs flowed more are likely soon (a producer's next batch, a workflow's next step), so
the first idle look comes after a sixteenth of `POLL_INTERVAL`, and each empty one
doubles the wait up to `POLL_INTERVAL`: a job enqueued after a long quiet spell starts
within `POLL_INTERVAL` (half of it on average), one enqueued just after others within a
fraction of it, and an idle worker costs one claim per `POLL_INTERVAL`.
"""

from __future__ import annotations

FIRST_FRACTION = 1 / 16
"""The first idle wait after jobs flowed, as a fraction of `POLL_INTERVAL`."""


class IdlePolls:
    """The waits of one polling claimer: `jobs_flowed()` when a claim took jobs,
    `next_wait()` for each idle sleep."""

    def __init__(self, poll_interval: float) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval!r}")
        self.poll_interval = poll_interval
        self._next = poll_interval  # a worker that just started has seen no jobs flow

    def jobs_flowed(self) -> None:
        """A claim took jobs: the next idle look comes soon."""
        self._next = self.poll_interval * FIRST_FRACTION

    def next_wait(self) -> float:
        """Seconds to sleep before the next look; each call doubles the next, up to the
        poll interval."""
        wait = self._next
        self._next = min(self.poll_interval, wait * 2)
        return wait
