"""What the chaos soak (benchmarks/chaos.py) watches while it runs, every SAMPLE_EVERY s.

Two invariants cannot be seen in the end state, only while the soak runs:

- `running past its lease`: no job stays `running` GRACE s past its lease while the
  database is reachable (a claim nobody works on and nobody recovers);
- `claims stalled`: while plain jobs are due and not paused, the database has been
  reachable for a while and some worker is neither frozen nor killed, some handler
  starts within STALL s (the runs file grows). A worker frozen while it holds the
  claim's caps lock would otherwise stall every other worker, unseen.

Both are sampled only once the database has been back GRACE (or STALL) s after an
outage: during one, nothing can be claimed or recovered, by design.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connections

from benchmarks import chaos_checks as checks

SAMPLE_EVERY = 2.0
STALL = 8.0
"""Seconds without a handler start, plain jobs due, that make a stall: longer than a
PostgreSQL restart or a reconnection after a cut takes."""


class Watch:
    """The sampled invariants' findings, over every loop of the soak."""

    def __init__(self, runs: Path) -> None:
        self.runs = runs
        self.stuck: dict[int | None, checks.Violation] = {}
        """Stuck runs, once each."""
        self.stalls: list[checks.Violation] = []
        self.next_sample = time.monotonic() + SAMPLE_EVERY
        self.size = 0
        self.grew = time.monotonic()
        """When the runs file last grew (a handler started)."""
        self.stalled = False
        """A stall is being seen (recorded once, until handlers start again)."""

    def violations(self) -> list[checks.Violation]:
        return [*self.stuck.values(), *self.stalls]

    def sample(self, injector: Any, fleet: Any) -> None:
        """Look, if it is time; a database error (a restart) skips this look."""
        now = time.monotonic()
        if now < self.next_sample:
            return
        self.next_sample = now + SAMPLE_EVERY
        try:
            self._look(now, injector, fleet)
        except DatabaseError:
            connections.close_all()

    def _look(self, now: float, injector: Any, fleet: Any) -> None:
        size = self.runs.stat().st_size if self.runs.exists() else 0
        if size != self.size:
            self.size, self.grew, self.stalled = size, now, False
        if injector.outage():
            return
        healthy_for = now - injector.healthy_since
        if healthy_for > checks.GRACE:
            for violation in checks.stuck_running(injector.origin):
                self.stuck.setdefault(violation.job, violation)
        quiet = now - self.grew
        if self.stalled or quiet < STALL or healthy_for < STALL:
            return
        if "chaos.plain" in injector.paused_kinds() or not fleet.awake():
            return
        due = checks.due_jobs("chaos.plain")
        if due:
            self.stalled = True
            frozen = sorted(fleet.frozen)
            detail = (
                f"no handler started for {quiet:.0f}s with {due} plain jobs due; "
                f"{len(fleet.awake())} workers awake, frozen: {frozen or 'none'}"
            )
            at = time.time() - quiet
            self.stalls.append(checks.Violation("claims stalled", None, detail, at))
