"""What a worker says of itself to a probe: is it alive, is it ready (`health_server.py`
serves both over HTTP).

- Alive (`/livez`): no part of the worker has stalled, by the liveness watch's own
  rule (`liveness.py`): no part at work for longer than `STALL_TIMEOUT` without
  coming round, and the watch has not found one. A worker waiting out a database
  outage is alive (waiting is not a stall): restarting it would not bring the
  database back. A worker that is not alive is already stopping with a failure;
  the probe lets a supervisor see it before the process ends, or when it cannot end.
  With `STALL_TIMEOUT` None nothing is watched, and alive only means that the
  process answers.
- Ready (`/readyz`): alive, past its start-up (its database answered, it
  registered, its claim loop runs), not stopping, its database not lost, and its
  heartbeat written within the grace after which others count it stale
  (`registration.stale_after()`, what `venturi_stats --check-workers` and the admin
  use).

Both read only what the worker's threads already keep in memory: answering never
waits for the database or for a lock the worker's loops hold for long.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from django_venturi.store import registration
from django_venturi.worker.heartbeats import Heartbeat
from django_venturi.worker.liveness import CLAIM_LOOP, Watch
from django_venturi.worker.supervision import DatabaseHealth


@dataclasses.dataclass(frozen=True)
class Answer:
    """A probe's verdict, with the reason a person reads."""

    ok: bool
    reason: str


class WorkerProbes:
    """Alive and ready, from the worker's liveness watch, database health and heartbeat."""

    def __init__(
        self,
        watch: Watch,
        database: DatabaseHealth,
        heartbeat: Heartbeat,
        *,
        stopping: threading.Event,
    ) -> None:
        self.watch = watch
        self.database = database
        self.heartbeat = heartbeat
        self.stopping = stopping
        """Set once the worker was asked to stop (or stops on a failure)."""

    def alive(self) -> Answer:
        """Alive unless a part of the worker stalled (by the liveness watch's rule)."""
        stall = self.watch.found or self.watch.progress.stall(self.watch.bound)
        if stall is not None:
            return Answer(False, f"stalled: {stall}")
        return Answer(True, "alive")

    def ready(self) -> Answer:
        """Ready when alive, claiming, connected, and its heartbeat written within the grace."""
        alive = self.alive()
        if not alive.ok:
            return alive
        if self.stopping.is_set():
            return Answer(False, "stopping: it claims no more jobs")
        if not self.watch.progress.has_begun(CLAIM_LOOP):
            return Answer(False, "starting: waiting for its database, or registering")
        if self.database.is_down:
            return Answer(False, "lost the database: waiting for it to come back")
        return self._heartbeat_fresh()

    def _heartbeat_fresh(self) -> Answer:
        grace = registration.stale_after().total_seconds()
        written = self.heartbeat.written_at
        if written is None:
            return Answer(False, "no heartbeat written yet")
        age = time.monotonic() - written
        if age > grace:
            return Answer(False, f"no heartbeat written for {age:.0f} s (grace {grace:g} s)")
        return Answer(True, "ready: connected, claiming, heartbeat written")
