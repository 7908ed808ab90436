"""The heartbeat: one thread that keeps a worker's leases and its registry row alive.

Every heartbeat interval, in this order, on the heartbeat's own connection:

1. extend the lease of every run the worker holds, skipping rows that another
   session holds locked (`leases.extend`: never waiting on anyone); a run whose
   row says it is no longer ours sees `ctx.should_stop`;
2. learn the cancel requests of held runs (SQLite has no NOTIFY);
3. beat the worker's registry row. A beat proves the worker alive, so a lease
   that ran out while the worker kept beating is not recovered by others
   (`leases.recover_expired`); the beat comes after the extension, so a worker
   that cannot extend its leases does not claim to be alive;
4. now and then, recover its own orphans: jobs claimed in its name that it does
   not hold (a claim whose answer a broken connection lost);
5. now and then, look for orphan kinds in its queues: due jobs no live worker
   can run (`orphan_watch.OrphanWatch`, which warns). Its failure is not the
   heartbeat's: it is logged and tried again at the next look.

Runs whose row was locked are tried again soon, not a whole interval later.

A beat speaks for the whole worker (`liveness.py`): once a part of the worker
has stalled (the heartbeat among them), it beats no more (no lease extended, no
registry row refreshed), and the worker stops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django import db

from django_venturi.conf import venturi_settings
from django_venturi.registry import registry
from django_venturi.store import leases, registration
from django_venturi.worker.execution import Execution
from django_venturi.worker.liveness import HEARTBEAT, Progress
from django_venturi.worker.orphan_watch import OrphanWatch
from django_venturi.worker.runs import Runs
from django_venturi.worker.supervision import DatabaseHealth, Service, Streak

BUSY_RETRY = 0.1
"""Seconds before extending again a lease whose row was locked."""
ORPHAN_AUDIT_BEATS = 3
"""Heartbeats between two looks for this worker's orphans."""


def heartbeat_interval() -> float:
    """The setting, or a third of the shortest lease of a known task if that is shorter."""
    shortest = min(
        (spec.lease for spec in registry.specs() if spec.lease is not None),
        default=venturi_settings.DEFAULT_LEASE,
    )
    return min(venturi_settings.HEARTBEAT_INTERVAL, shortest / 3).total_seconds()


class Heartbeat(Service):
    name = "heartbeat"

    def __init__(
        self,
        *,
        alias: str,
        worker: str,
        runs: Runs,
        health: DatabaseHealth,
        interval: float,
        register: Callable[[], None],
        processed: Callable[[], int],
        on_cancel: Callable[[Execution, str], None],
        orphan_watch: OrphanWatch | None = None,
        see_peers: Callable[[], None] | None = None,
        progress: Progress | None = None,
        stalled: threading.Event | None = None,
        on_alive: Callable[[], object] = lambda: None,
    ) -> None:
        super().__init__()
        self.progress = progress or Progress()
        self.stalled = stalled or threading.Event()
        """Set when a part of the worker stalled: nothing is beaten any more."""
        self._on_alive = on_alive
        """Called at each turn while no part of the worker stalled, whether the database
        answers or not (systemd's watchdog: a frozen or stalled worker is restarted, one
        waiting out a database outage is not)."""
        self.alias = alias
        self.worker = worker
        self.runs = runs
        self.health = health
        self.interval = interval
        self._register = register
        self._processed = processed
        self._on_cancel = on_cancel
        self._orphan_watch = orphan_watch
        self._see_peers = see_peers
        self.written_at: float | None = None
        """When (`time.monotonic()`) a beat or the registration was last written."""
        self._done = threading.Event()
        self._streak = Streak()
        self._next_audit = time.monotonic() + ORPHAN_AUDIT_BEATS * interval

    def stop(self) -> None:
        self._done.set()

    def loop(self) -> None:
        with self.progress.watching(HEARTBEAT):
            self._loop()

    def _loop(self) -> None:
        wait = self.interval
        while True:
            self.progress.waiting(HEARTBEAT)
            if self._done.wait(wait):
                return
            self.progress.working(HEARTBEAT)
            if self.stalled.is_set():
                wait = self.interval
                continue
            self._on_alive()
            busy = self.health.guarded(self.beat, what="the heartbeat", streak=self._streak)
            if busy is None:
                wait = min(self.interval, self.health.delay(self._streak.count))
                continue
            self.written_at = time.monotonic()
            wait = BUSY_RETRY if busy else self.interval
            if self._orphan_watch is not None:
                self.health.guarded(
                    self._orphan_watch.look_if_due, what="looking for jobs no worker can run"
                )

    def register(self) -> None:
        """Register the worker at its start: its first heartbeat, in effect."""
        self._register()
        self.written_at = time.monotonic()

    def beat(self) -> int:
        """One heartbeat; return how many held runs' rows were locked by others."""
        held = self.runs.held()
        busy = 0
        if held:
            extension = leases.extend(self.alias, [execution.job for execution in held])
            busy = len(extension.busy)
            still = [e for e in held if extension.held(e.job.run_key)]
            for execution in held:
                if not extension.held(execution.job.run_key):
                    execution.lease_lost.set()
            asked = leases.cancel_requests(self.alias, [e.job for e in still])
            for execution in still:
                if execution.job.run_key in asked:
                    self._on_cancel(execution, "heartbeat")
        if not registration.beat(
            self.alias, name=self.worker, running=len(held), processed=self._processed()
        ):
            self._register()
        if self._see_peers is not None:
            self._see_peers()
        if time.monotonic() >= self._next_audit:
            self._next_audit = time.monotonic() + ORPHAN_AUDIT_BEATS * self.interval
            # Held as of this beat's start: a run claimed since has a fresh lease.
            leases.recover_orphans(self.alias, self.worker, [e.job.run_key for e in held])
        return busy

    def extend_one(self, execution: Execution) -> bool:
        """`ctx.heartbeat()`: extend one run's lease from its handler's thread."""
        try:
            extension = leases.extend(self.alias, [execution.job])
        except Exception:  # the handler goes on; the next heartbeat tries again
            db.close_old_connections()
            return not execution.lease_lost.is_set()
        if not extension.held(execution.job.run_key):
            execution.lease_lost.set()
            return False
        return True
