"""The worker: a supervisor and the services it starts, each one loop in one thread.

- the claimer (`claimer.py`, the main thread) claims due jobs into free handler
  slots, recovers expired leases and runs the periodic scheduler;
- the handlers (`handlers.py`): threads for sync handlers, one event loop for
  `async def` ones;
- the results writer (`results.py`) writes verdicts in batches;
- the heartbeat (`heartbeats.py`) extends leases and beats the registry row, on a
  connection of its own, never behind result writes or anyone's row lock;
- on PostgreSQL, the listener (`listener.py`) wakes the claimer on NOTIFY;
- the history writer (`history.py`) writes the figures of runs per minute;
- the timeout watchdog (`timeouts.py`) and, when configured, the retention
  sweeper and the maintainer (`housekeeping.py`).

Runs are identified by their claim (`runs.py`). No service dies silently: the
supervisor sees a service that died, stops claiming, releases what the worker
holds and raises `WorkerFailed` (the command exits non-zero).

The management command `venturi_worker` only parses flags and builds a `Worker`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta

from django.db import connections

from django_venturi.conf import (
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL,
    MAX_SHUTDOWN_TIMEOUT,
    venturi_settings,
)
from django_venturi.observe import telemetry
from django_venturi.states import JournalOutcome
from django_venturi.store import orphan_kinds, registration, verdicts
from django_venturi.store.cancel import cancel_channel
from django_venturi.store.claim import ClaimedJob
from django_venturi.store.completion import write_verdicts
from django_venturi.store.pauses import pause_channel
from django_venturi.store.verdicts import Verdict
from django_venturi.tasks_backend import runner
from django_venturi.worker import first_contact, options, stop_signals, systemd
from django_venturi.worker.claimer import Claimer
from django_venturi.worker.execution import Execution
from django_venturi.worker.handlers import Handlers
from django_venturi.worker.heartbeats import Heartbeat, heartbeat_interval
from django_venturi.worker.history import HistoryWriter
from django_venturi.worker.housekeeping import start_housekeeping
from django_venturi.worker.listener import Listener, listener_alias
from django_venturi.worker.liveness import STALL_EXIT_WAIT, START_UP, Progress, Stall, Watch
from django_venturi.worker.orphan_watch import OrphanWatch
from django_venturi.worker.pause_watch import PauseWatch
from django_venturi.worker.probes import WorkerProbes
from django_venturi.worker.results import ResultsWriter
from django_venturi.worker.run_events import RunEvents
from django_venturi.worker.runs import Runs
from django_venturi.worker.supervision import DatabaseHealth, Service
from django_venturi.worker.timeouts import Watchdog
from django_venturi.worker.wake_order import ListenerLocks, WakeOrder

logger = logging.getLogger("django_venturi.worker")


class WorkerFailed(RuntimeError):
    """A part of the worker could not go on: it released what it held and stopped."""


class Worker:
    """A worker process's whole life: `run()` until stopped, or until idle with `burst`."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        shutdown_timeout: timedelta | float | None = None,
        poll_interval: timedelta | float | None = None,
        burst: bool = False,
        database: str | None = None,
        batch_size: int | None = None,
        name: str | None = None,
        kind_concurrency: dict[str, int] | None = None,
        list_kinds: bool = False,
    ) -> None:
        self.queues = list(queues) if queues else None
        self.list_kinds = list_kinds
        """Name every kind in the start-up line (`-v 2`), not only the first few."""
        self.kind_concurrency = dict(kind_concurrency or {})
        """Per-worker caps: at most N jobs of a kind at once in this process."""
        self.concurrency = options.whole_number(
            "concurrency", concurrency or venturi_settings.CONCURRENCY, largest=MAX_CONCURRENCY
        )
        self.shutdown_timeout = options.seconds(
            "shutdown_timeout",
            venturi_settings.SHUTDOWN_TIMEOUT if shutdown_timeout is None else shutdown_timeout,
            longest=MAX_SHUTDOWN_TIMEOUT,
            zero=True,
        )
        self.poll_interval = options.seconds(
            "poll_interval",
            venturi_settings.POLL_INTERVAL if poll_interval is None else poll_interval,
            longest=MAX_POLL_INTERVAL,
        )
        self.burst = burst
        self.database = database or venturi_settings.DATABASE
        self.batch_size = options.whole_number(
            "batch_size", batch_size or venturi_settings.BATCH_SIZE, largest=MAX_BATCH_SIZE
        )
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        options.check_name(self.name)
        self.heartbeat_interval = heartbeat_interval()
        tasks_kind_prefix = runner.claimable_prefix()
        self.kinds = orphan_kinds.runnable_kinds(tasks_kind_prefix)
        """What it can run: its tasks' kinds, and `tasks:*` if it runs Django Tasks jobs."""

        self._stop = threading.Event()
        """Set at the first stop request: claim nothing more; handlers see should_stop."""
        self._force = threading.Event()
        """Set at the second stop request: skip the wait for running handlers."""
        self._wake = threading.Event()
        self.runs = Runs()
        self.progress = Progress()
        """Where each part of the worker is: the heartbeat beats only while they progress."""
        self._stalled_event = threading.Event()
        self.liveness = Watch(
            self.progress,
            bound=venturi_settings.STALL_TIMEOUT,
            on_stall=self._stalled,
        )
        self.health = DatabaseHealth(worker=self.name, alias=self.database)
        self.events = RunEvents(self.name, sender=Worker)
        self.results = ResultsWriter(
            alias=self.database,
            runs=self.runs,
            health=self.health,
            events=self.events,
            force=self._force,
            on_written=self._written,
            progress=self.progress,
        )
        self.handlers = Handlers(
            concurrency=self.concurrency,
            runs=self.runs,
            results=self.results,
            events=self.events,
            wake=self._wake_claimer,
            progress=self.progress,
        )
        self.health.on_database_error = self._on_database_error
        self.orphan_watch = OrphanWatch(alias=self.database, worker=self.name, queues=self.queues)
        self.heartbeat = Heartbeat(
            alias=self.database,
            worker=self.name,
            runs=self.runs,
            health=self.health,
            interval=self.heartbeat_interval,
            register=self._register,
            processed=lambda: self.processed,
            on_cancel=self._cancel_requested,
            orphan_watch=self.orphan_watch,
            see_peers=self._see_peers,
            progress=self.progress,
            stalled=self._stalled_event,
            on_alive=systemd.watchdog,
        )
        self.probes = WorkerProbes(self.liveness, self.health, self.heartbeat, stopping=self._stop)
        """Whether it is alive and ready (`venturi_worker --health-port` serves them)."""
        listening = connections[self.database].vendor == "postgresql"
        self.wake_order = (
            WakeOrder(worker=self.name, queues=self.queues, kinds=self.kinds) if listening else None
        )
        self.pause_watch = PauseWatch(
            alias=self.database,
            runs=self.runs,
            handlers=self.handlers,
            every=None if listening else self.poll_interval,
        )
        self.claimer = Claimer(
            worker=self.name,
            alias=self.database,
            queues=self.queues,
            batch_size=self.batch_size,
            poll_interval=self.poll_interval,
            burst=burst,
            kind_concurrency=self.kind_concurrency,
            tasks_kind_prefix=tasks_kind_prefix,
            runs=self.runs,
            handlers=self.handlers,
            health=self.health,
            stop=self._stop,
            wake=self._wake,
            make_execution=self._execution,
            service_died=self._service_died,
            pause_watch=self.pause_watch,
            listening=self._listening,
            wake_order=self.wake_order,
            progress=self.progress,
        )
        self.history = HistoryWriter(alias=self.database, worker=self.name, health=self.health)
        self._services: list[Service] = [self.results, self.heartbeat, self.history]
        self._database_answered = False
        """The database answered before anything started (`first_contact`)."""
        self._listener: Listener | None = None
        self._failure: str | None = None
        self.exit_if_wedged: Callable[[], None] | None = None
        """Ends the process at once (`venturi_worker` sets it): called when the worker
        stalled and its shutdown did not end within STALL_EXIT_WAIT seconds."""
        self.left_running = 0
        """Handlers still running when the worker stopped (released at shutdown, or
        abandoned past their timeout): their results are dropped, nothing waits for them."""

    @property
    def processed(self) -> int:
        """Runs whose verdict this worker wrote."""
        return self.results.processed

    # ------------------------------------------------------------ public

    def run(self) -> None:
        """Work until `stop()` (or a signal), or with `burst`, until nothing is due.

        Raises `WorkerFailed` if a part of the worker died: by then it has stopped
        claiming and handed back what it held.
        """
        logger.info(
            "worker %s starting: queues=%s concurrency=%d %s",
            self.name,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            orphan_kinds.describe(
                self.kinds, all_of_them=self.list_kinds or logger.isEnabledFor(logging.DEBUG)
            ),
            extra={"worker": self.name, "kinds": self.kinds},
        )
        if not self.wait_for_database():
            logger.info("worker %s stopped before it started", self.name)
            return
        # A configuration error stops the worker here, before it registers: a worker
        # that never ran must not be listed as live.
        telemetry.install(database=self.database)
        self._start_services()
        with self.progress.watching(START_UP):  # watched as the loops are: it may hang too
            self.health.guarded(self.heartbeat.register, what="registering the worker")
            self.health.guarded(
                self.orphan_watch.look_at_start, what="looking for jobs no worker can run"
            )
        queues = ",".join(self.queues) if self.queues else "*"
        systemd.ready(status=f"working: queues={queues} concurrency={self.concurrency}")
        try:
            start_housekeeping(alias=self.database, stop=self._stop)
            self.claimer.loop()
        finally:
            self._shut_down()
        if self._failure is not None:
            raise WorkerFailed(self._failure)

    def wait_for_database(self) -> bool:
        """Wait until the database answers (`first_contact`); False if stopped first."""
        if not self._database_answered:
            self._database_answered = first_contact.wait_for_database(
                self.database, worker=self.name, burst=self.burst, stop=self._stop
            )
        return self._database_answered

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop: finish running jobs, then release what is left.

        Safe to call from any thread (not from a signal handler: see
        `install_signal_handlers`). A second call (or
        `force=True`) skips the wait for running handlers.
        """
        if self._stop.is_set() or force:
            self._force.set()
        self._stop.set()
        self._wake.set()

    def install_signal_handlers(self) -> Callable[[], None]:
        """Make SIGTERM and SIGINT call `stop()`; return a function restoring the old
        handlers (see `stop_signals.py` for why a signal only queues a request)."""
        return stop_signals.install(name=self.name, stop=self.stop, stopping=self._stop.is_set)

    # ------------------------------------------------------------ services

    def _start_services(self) -> None:
        for service in self._services:
            service.on_death = self._wake.set
            service.start()
        self.handlers.start()
        self.liveness.start()
        self._watchdog = Watchdog(
            executing=self.runs.executing, abandon=self.handlers.abandon, stopped=self._force
        )
        self._watchdog.start()
        listen_alias = listener_alias(self.database)
        if connections[listen_alias].vendor == "postgresql":
            self._listener = Listener(
                alias=listen_alias,
                channels={
                    venturi_settings.NOTIFY_CHANNEL: self._on_jobs_notify,
                    cancel_channel(): self._on_cancel_notify,
                    pause_channel(): self._on_pause_notify,
                },
                session=(
                    None
                    if self.wake_order is None
                    else ListenerLocks(self.wake_order, wake=self._wake_claimer)
                ),
            )
            self.health.on_back = self._listener.renew  # a failover may have left it behind
            self._listener.start()

    def _service_died(self) -> bool:
        """The supervisor's look at its services: True once one died (and say so once)."""
        if self._failure is not None:
            return True
        dead = [service for service in self._services if service.died()]
        if not dead:
            return False
        service = dead[0]
        self._failure = f"the worker's {service.name} died: {service.failure!r}"
        logger.critical(
            "worker %s stops: %s; it releases what it holds and exits non-zero",
            self.name,
            self._failure,
            extra={"worker": self.name},
        )
        self._stop.set()
        return True

    def _stalled(self, stall: Stall) -> None:
        """A part of the worker stalled (from the liveness watch): stop, and exit non-zero.

        Its leases are extended no more. The runs not started are handed back; if the
        shutdown itself cannot end (the stalled part is the one it waits for), the
        process ends after STALL_EXIT_WAIT seconds, and the leases hand back the rest."""
        self._stalled_event.set()
        self._failure = f"{stall}; stopping so that a supervisor starts a fresh worker"
        logger.critical(
            "worker %s stops: %s (STALL_TIMEOUT); its leases are no longer extended",
            self.name,
            stall,
            extra={"worker": self.name},
        )
        self._stop.set()
        self._force.set()
        self._wake.set()
        if self.exit_if_wedged is not None:
            backstop = threading.Timer(STALL_EXIT_WAIT, self.exit_if_wedged)
            backstop.daemon = True
            backstop.start()

    def _execution(self, job: ClaimedJob, claimed: float) -> Execution:
        return Execution(
            job,
            database=self.database,
            stop=self._stop,
            heartbeat=self.heartbeat.extend_one,
            worker=self.name,
            claimed=claimed,
        )

    def _wake_claimer(self) -> None:
        """Wake the claim loop (from the handlers and the results writer, often)."""
        if not self._wake.is_set():  # `set()` takes a lock and notifies every time
            self._wake.set()

    def _written(self, verdicts: Sequence[Verdict]) -> None:
        """Verdicts were written: count them; wake the claim loop if they call for a claim."""
        self.history.record(verdicts)
        if self.claimer.claim_after(verdicts):
            self._wake_claimer()

    def _on_jobs_notify(self, payload: str | None) -> None:
        """New jobs (or a reconnect): wake the claim loop if this worker is called."""
        if self.wake_order is None or self.wake_order.answers(payload):
            self._wake_claimer()

    def _see_peers(self) -> None:
        """Read the live workers: who comes first in this worker's wake-up group."""
        if self.wake_order is not None:
            self.wake_order.see(registration.live_peers(self.database))

    def _listening(self) -> bool:
        """Whether new jobs wake this worker (its listener is connected)."""
        return self._listener is not None and self._listener.connected.is_set()

    def _register(self) -> None:
        registration.register(
            self.database,
            name=self.name,
            queues=self.queues,
            concurrency=self.concurrency,
            heartbeat_interval=timedelta(seconds=self.heartbeat_interval),
            kinds=self.kinds,
        )
        self.claimer.registered()
        self._see_peers()

    def _on_database_error(self) -> None:
        self.handlers.async_connections_checked = False

    # ------------------------------------------------------------ shutting down

    def _shut_down(self) -> None:
        self._stop.set()
        systemd.stopping()
        self.claimer.hand_on_calls()  # this worker claims no more: the next ones may
        self.handlers.release(self.runs.take_queued(), reason="")
        deadline = time.monotonic() + self.shutdown_timeout
        while (
            self.runs.busy()
            and time.monotonic() < deadline
            and not self._force.is_set()
            and not self.results.died()
        ):
            self.claimer.hand_on_calls()
            time.sleep(0.02)
        still_running = self.runs.take_executing()
        self.handlers.release(still_running, reason="still running at shutdown")
        self.left_running = len(still_running) + self.handlers.lost_threads()
        self.results.close()
        self._wait_for(self.results)
        if self.results.died() or self.results.is_alive():
            self._release_directly()
        self.history.stop()
        self.heartbeat.stop()
        self.liveness.stop()
        self._wait_for(self.history)
        self._wait_for(self.heartbeat)
        self.handlers.stop()
        self.health.guarded(
            lambda: registration.stopped(self.database, name=self.name, processed=self.processed),
            what="marking the worker stopped",
        )
        if self._listener is not None:
            self._listener.stop()
        connections.close_all()
        logger.info(
            "worker %s stopped after %d %s",
            self.name,
            self.processed,
            "run" if self.processed == 1 else "runs",
            extra={"worker": self.name, "runs": self.processed},
        )

    def _release_directly(self) -> None:
        """The results writer died: hand back what the worker holds from this thread."""
        held = [verdicts.released(execution.job) for execution in self.runs.held()]
        if held:
            self.health.guarded(
                lambda: write_verdicts(self.database, self.name, held),
                what="releasing held jobs",
            )

    def _wait_for(self, service: Service) -> None:
        """Join a service; if it died, what it held is left to lease recovery. After a
        stall, for STALL_EXIT_WAIT seconds at most: it may be the stalled part."""
        if service.started:
            service.join(STALL_EXIT_WAIT if self._stalled_event.is_set() else None)
        if service.died():
            self._service_died()

    # ------------------------------------------------------------ cancel

    def _on_pause_notify(self, payload: str | None) -> None:
        """A pause or resume (or None after the listener reconnected): look at once."""
        self.pause_watch.changed()
        self._wake.set()

    def _on_cancel_notify(self, payload: str | None) -> None:
        """A cancel NOTIFY (job ids), or None after the listener (re)connected."""
        if payload is None:
            return  # missed requests are found by the next heartbeat
        asked = {int(part) for part in payload.split(",") if part.strip().isdigit()}
        for execution in self.runs.held_by_job(asked):
            self._cancel_requested(execution, "notification")

    def _cancel_requested(self, execution: Execution, source: str) -> None:
        if execution.cancel_requested.is_set():
            return
        execution.cancel_requested.set()
        logger.info(
            "job %d: cancel requested (learnt by %s); the handler sees should_stop",
            execution.job.id,
            source,
            extra=self.events.log_extra(execution.job, JournalOutcome.CANCELLED),
        )
