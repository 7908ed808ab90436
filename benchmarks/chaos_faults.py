"""The chaos soak's faults (benchmarks/chaos.py): a seeded random schedule, and its log.

Every 1-4 s one fault is drawn (weights in FAULTS) and injected:

- `kill`: SIGKILL a worker (its supervisor starts another);
- `freeze`: SIGSTOP a worker for 2-8 s (past its 3 s leases), then SIGCONT;
- `restart`: restart PostgreSQL (every connection closed, refused until it is back);
- `read_only`: the server refuses writes with SQLSTATE 25006 for 2-6 s, as a
  demoted or fenced primary does;
- `cut`: the proxy resets every worker connection at once;
- `blackhole`: the proxy stops forwarding for 2-8 s, closing nothing, then heals;
- `dead_nat`: a blackhole that ends with the flows forgotten: servers see their
  clients go, the workers' sockets stay open and silent forever;
- `pause`: a kind is paused for 2-5 s, then resumed;
- `cancel`: a few slow jobs (running or not) and now and then a chain are cancelled.

Windows that take the database away (read_only, blackhole, dead_nat) never overlap,
so each violation can be put next to the one that preceded it. Every fault is
logged with its wall-clock time: the checks list the faults around a violation.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections

from benchmarks.chaos_fleet import Fleet
from benchmarks.chaos_producer import Producer
from django_venturi.worker.liveness import STALL_EXIT_WAIT

FAULTS = {
    "kill": 3,
    "freeze": 2,
    "restart": 1,
    "read_only": 2,
    "cut": 2,
    "blackhole": 1,
    "dead_nat": 1,
    "pause": 2,
    "cancel": 3,
}
OUTAGES = {"read_only", "blackhole", "dead_nat"}
PAUSABLE = ("chaos.plain", "chaos.slow", "chaos.limited", "chaos.atomic")
GAP = (1.0, 4.0)
"""Seconds between two faults."""
RETRY_END = 0.5
SOAK_STALL_TIMEOUT = 10.0
"""The workers' `STALL_TIMEOUT` (bench_project/chaos_settings.py)."""
WEDGED_RECOVERY = SOAK_STALL_TIMEOUT + STALL_EXIT_WAIT + 10.0
"""After a dead NAT every worker is wedged on connections that never answer (through
this proxy even TCP keepalives are answered): each stops once its liveness watch sees
it stalled (`STALL_TIMEOUT`), ends its process at most `STALL_EXIT_WAIT` later, and
its replacement starts. Until then the database counts as not yet given back."""
"""Seconds before ending a window again when the database refused (a resume)."""
STOP_DEADLINE = 120.0


@dataclass
class Fault:
    kind: str
    at: float
    """Wall clock (comparable with the database's timestamps)."""
    detail: str
    ended: float | None = None

    def line(self, origin: float) -> str:
        span = f"-{self.ended - origin:.1f}s" if self.ended is not None else ""
        return f"{self.at - origin:7.1f}s{span} {self.kind} {self.detail}"


@dataclass
class Window:
    fault: Fault
    until: float
    """Monotonic time at which `undo` runs."""
    undo: Callable[[], None]


class Injector:
    """Draws and injects the faults; ends their windows; keeps the log."""

    def __init__(
        self,
        cluster: Any,
        proxy: Any,
        fleet: Fleet,
        producer: Producer,
        rng: random.Random,
        skip: frozenset[str] = frozenset(),
    ) -> None:
        self.weights = {kind: weight for kind, weight in FAULTS.items() if kind not in skip}
        """The faults drawn: FAULTS but those skipped (`--skip`)."""
        self.cluster = cluster
        self.proxy = proxy
        self.fleet = fleet
        self.producer = producer
        self.rng = rng
        self.log: list[Fault] = []
        self.windows: list[Window] = []
        self.next_at = time.monotonic() + rng.uniform(*GAP)
        self.origin = time.time()
        self.healthy_since = time.monotonic()
        """When the database was last given back (the end of the last outage); see
        `_given_back`."""
        self.skipped = 0
        self.faults_over: float | None = None
        """When the chaos ended (wall clock)."""

    def tick(self) -> None:
        now = time.monotonic()
        for window in [w for w in self.windows if now >= w.until]:
            self._end(window)
        if now < self.next_at:
            return
        self.next_at = now + self.rng.uniform(*GAP)
        if not self.weights:
            return
        kinds = list(self.weights)
        kind = self.rng.choices(kinds, [self.weights[k] for k in kinds])[0]
        if self.outage() and (kind in OUTAGES or kind in {"pause", "cancel", "restart"}):
            return  # one database outage at a time; nothing that needs the database
        getattr(self, f"_{kind}")()

    def paused_kinds(self) -> set[str]:
        """Kinds paused by an open `pause` window."""
        return {w.fault.detail.split()[0] for w in self.windows if w.fault.kind == "pause"}

    def outage(self) -> bool:
        return any(window.fault.kind in OUTAGES for window in self.windows)

    def stop(self) -> None:
        """End every window now (the soak's chaos is over): outages first, the others
        (which may need the database) until they succeed."""
        deadline = time.monotonic() + STOP_DEADLINE
        while self.windows:
            ordered = sorted(self.windows, key=lambda w: w.fault.kind not in OUTAGES)
            if not all(self._end(window) for window in ordered):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"chaos: cannot end {[w.fault for w in self.windows]}")
                time.sleep(RETRY_END)
        self.fleet.thaw_all()
        if self.faults_over is None:
            self.faults_over = time.time()

    # ------------------------------------------------------------ bookkeeping

    def _record(self, kind: str, detail: str = "") -> Fault:
        fault = Fault(kind, time.time(), detail)
        self.log.append(fault)
        print(f"chaos: {fault.line(self.origin)}", flush=True)
        return fault

    def _open(self, fault: Fault, seconds: float, undo: Callable[[], None]) -> None:
        self.windows.append(Window(fault, time.monotonic() + seconds, undo))

    def _end(self, window: Window) -> bool:
        """Undo a window's fault; if the database refuses (a resume while it is read-only),
        try again at a later tick: this loop is also the one that ends the outage."""
        try:
            window.undo()
        except DatabaseError as error:
            connections.close_all()
            window.until = time.monotonic() + RETRY_END
            print(f"chaos: ending {window.fault.kind}: {error}; again", flush=True)
            return False
        window.fault.ended = time.time()
        self.windows.remove(window)
        if window.fault.kind in OUTAGES:
            wedged = WEDGED_RECOVERY if window.fault.kind == "dead_nat" else 0.0
            self._given_back(time.monotonic() + wedged)
        return True

    def _given_back(self, moment: float) -> None:
        """The database counts as given back at `moment`, or later if an earlier fault
        said so: a restart right after a dead NAT does not unwedge the workers it left
        on forgotten flows (the server's closes never reach them)."""
        self.healthy_since = max(self.healthy_since, moment)

    # ------------------------------------------------------------ the faults

    def _kill(self) -> None:
        pid = self.fleet.kill(self.rng)
        self._record("kill", f"worker pid {pid}")

    def _freeze(self) -> None:
        seconds = self.rng.uniform(2, 8)
        pid = self.fleet.freeze(self.rng, seconds)
        fault = self._record("freeze", f"worker pid {pid} for {seconds:.1f}s")
        fault.ended = fault.at + seconds

    def _restart(self) -> None:
        fault = self._record("restart", "PostgreSQL")
        self.cluster.restart()
        connections.close_all()
        fault.ended = time.time()
        self._given_back(time.monotonic())

    def _read_only(self) -> None:
        seconds = self.rng.uniform(2, 6)
        fault = self._record("read_only", f"for {seconds:.1f}s")
        self.cluster.set_read_only(True)
        self._open(fault, seconds, lambda: self.cluster.set_read_only(False))

    def _cut(self) -> None:
        self._record("cut", f"{self.proxy.cut()} connections reset")

    def _blackhole(self) -> None:
        seconds = self.rng.uniform(2, 8)
        fault = self._record("blackhole", f"for {seconds:.1f}s")
        self.proxy.blackhole()
        self._open(fault, seconds, self.proxy.heal)

    def _dead_nat(self) -> None:
        seconds = self.rng.uniform(2, 8)
        fault = self._record("dead_nat", f"blackhole for {seconds:.1f}s, then flows forgotten")
        self.proxy.blackhole()

        def forget() -> None:
            fault.detail += f" ({self.proxy.forget()} connections)"
            self.proxy.heal()

        self._open(fault, seconds, forget)

    def _pause(self) -> None:
        import django_venturi as venturi

        kind = self.rng.choice(PAUSABLE)
        seconds = self.rng.uniform(2, 5)
        try:
            venturi.pause(kind=kind, by="chaos")
        except DatabaseError:
            connections.close_all()
            self.skipped += 1
            return
        fault = self._record("pause", f"{kind} for {seconds:.1f}s")
        self._open(fault, seconds, lambda: self._resume(kind))

    def _resume(self, kind: str) -> None:
        import django_venturi as venturi

        venturi.resume(kind=kind)

    def _cancel(self) -> None:
        try:
            asked = self.producer.cancel_some(time.time())
        except DatabaseError:
            connections.close_all()
            self.skipped += 1
            return
        self._record("cancel", f"jobs {asked}")
