"""Liveness is the whole worker's: the heartbeat speaks only for a worker that makes progress.

A heartbeat proves a worker alive: it extends the leases of the runs the worker
holds and keeps its registry row fresh, so nobody recovers those runs. A worker
whose heartbeat thread is fine but whose results writer is blocked (in a log
handler writing to a pipe nobody reads, say) or whose handler slots are all
taken by threads abandoned past their timeout would hold its runs for as long as
it lived, while looking alive to `venturi_stats --check-workers` and to others.

So each part the worker's runs depend on says when it is at work and when it is
waiting (`Progress`): the claim loop, the results writer and the heartbeat at each
turn of their loops, the handler pool while it has no slot left, and the worker's
start-up steps (a statement of theirs that hangs would otherwise keep a registered,
beating worker from ever claiming). A thread of its
own that touches no database (`Watch`) looks every second: a part at work for
longer than `VENTURI["STALL_TIMEOUT"]` without coming round is stalled (the
heartbeat itself may be the one stuck, in a statement on a connection that will
never answer). The heartbeat then stops extending leases and beating, and the
worker stops with a failure (it hands back the runs it has not started and exits
non-zero, for its supervisor to start a new one). What it holds but cannot hand
back, its leases hand back: they are no longer extended, so other workers
recover those runs when they run out.

Waiting for the database is not a stall: a part whose step failed waits between
its tries, and says so. A statement or a connection attempt that hangs past the
bound is one, whatever the cause (the worker's connections give up sooner by
themselves: `connect_timeout` 10 s, `tcp_user_timeout` 30 s, see `connections.py`):
a fresh process connects again. No exception is made while the database is said to
be away, since the part that would say it is back may be the one stuck.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

CLAIM_LOOP = "claim loop"
RESULTS_WRITER = "results writer"
HANDLER_POOL = "handler pool"
HEARTBEAT = "heartbeat"
START_UP = "start-up"
"""The steps between the services' start and the claim loop's (registering, the first look)."""
STALL_EXIT_WAIT = 10.0
"""Seconds a stalled worker's shutdown may take before the process ends anyway."""
WATCH_EVERY = 1.0
"""Seconds between two looks of the watch (at most a quarter of the bound)."""


@dataclass(frozen=True)
class Stall:
    """A part of the worker at work for too long without coming round."""

    part: str
    seconds: float

    def __str__(self) -> str:
        return f"its {self.part} made no progress for {self.seconds:.0f} s"


class Progress:
    """When each part of the worker started its current piece of work (None: waiting)."""

    def __init__(self) -> None:
        self._busy_since: dict[str, float | None] = {}

    def working(self, part: str) -> None:
        """`part` starts a new piece of work (a turn of its loop): its clock restarts."""
        self._busy_since[part] = time.monotonic()

    def waiting(self, part: str) -> None:
        """`part` waits for work (or for the database): it cannot stall."""
        self._busy_since[part] = None

    @contextmanager
    def watching(self, part: str) -> Iterator[None]:
        """For a loop's life: once it ends (a stopping worker waiting for its handlers,
        however long its shutdown timeout), nothing of it can stall."""
        self.working(part)
        try:
            yield
        finally:
            self.waiting(part)

    def has_begun(self, part: str) -> bool:
        """Whether `part` ever said where it is (a loop that has started, or has ended)."""
        return part in self._busy_since

    def stall(self, bound: float | None) -> Stall | None:
        """The part at work the longest, if for more than `bound` seconds."""
        if bound is None:
            return None
        now = time.monotonic()
        busy = [(now - since, part) for part, since in list(self._busy_since.items()) if since]
        if not busy:
            return None
        seconds, part = max(busy)
        return Stall(part, seconds) if seconds > bound else None


class Watch:
    """A thread that looks at `progress` and calls `on_stall` once, at the first stall."""

    def __init__(
        self,
        progress: Progress,
        *,
        bound: timedelta | None,
        on_stall: Callable[[Stall], None],
    ) -> None:
        self.progress = progress
        self.bound = None if bound is None else bound.total_seconds()
        self._on_stall = on_stall
        self.found: Stall | None = None
        """The stall it found (it looks no more): the worker is stopping for good."""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._look, name="venturi-liveness", daemon=True)

    def start(self) -> None:
        if self.bound is not None:
            self._thread.start()

    def stop(self) -> None:
        self._done.set()

    def _look(self) -> None:
        assert self.bound is not None
        every = min(WATCH_EVERY, self.bound / 4)
        while not self._done.wait(every):
            stall = self.progress.stall(self.bound)
            if stall is not None:
                self.found = stall
                self._on_stall(stall)
                return
