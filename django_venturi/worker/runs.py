"""What a worker holds: its runs, each identified by its claim (job id and claim token).

A job can be claimed twice by the same worker: a run that lost its lease while
its handler was still inside (a stall, a pause of the whole process) may still
be running when the job, recovered elsewhere, is claimed again here. Keyed by
job id, the stale run's end would remove the live run's entries; keyed by the
claim, each run only ever touches its own.

A run moves `queued` (claimed, waiting for a handler slot) -> `executing`
(handler running) -> written (its verdict is applied or discarded), and is
`held` from its claim until that write. Each run gets exactly one verdict:
whoever takes it out of `queued` or `executing` first (its handler finishing,
a release at shutdown, the timeout watchdog) is the one who decides it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable

from django_venturi.store.claim import ClaimedJob, RunKey
from django_venturi.worker.execution import Execution


class Runs:
    """The runs a worker holds, thread-safe; every method is one short critical section."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[RunKey, Execution] = {}
        self._executing: dict[RunKey, Execution] = {}
        self._held: dict[RunKey, Execution] = {}

    def add(self, execution: Execution) -> None:
        """A run was claimed: queued until a handler slot takes it."""
        key = execution.job.run_key
        with self._lock:
            self._queued[key] = execution
            self._held[key] = execution

    def start(self, execution: Execution) -> bool:
        """Queued -> executing; False if the run was released meanwhile (do not run it)."""
        key = execution.job.run_key
        with self._lock:
            if self._queued.pop(key, None) is None:
                return False
            self._executing[key] = execution
            return True

    def end(self, execution: Execution) -> bool:
        """Take a run out of `queued` or `executing`; True for the one caller that decides
        its verdict (its handler, a release, the watchdog), False for everyone after."""
        key = execution.job.run_key
        with self._lock:
            return (
                self._executing.pop(key, None) is not None
                or self._queued.pop(key, None) is not None
            )

    def written(self, jobs: Iterable[ClaimedJob]) -> None:
        """These runs' verdicts are written: the worker holds them no more."""
        with self._lock:
            for job in jobs:
                self._held.pop(job.run_key, None)

    def take_queued(self) -> list[Execution]:
        """Every run not started yet (to release them)."""
        with self._lock:
            waiting = list(self._queued.values())
            self._queued.clear()
            return waiting

    def take_queued_where(self, wanted: Callable[[Execution], bool]) -> list[Execution]:
        """The runs not started yet that `wanted` picks (to release them)."""
        with self._lock:
            picked = [execution for execution in self._queued.values() if wanted(execution)]
            for execution in picked:
                del self._queued[execution.job.run_key]
            return picked

    def take_executing(self) -> list[Execution]:
        """Every run whose handler is still inside (to release them)."""
        with self._lock:
            running = list(self._executing.values())
            self._executing.clear()
            return running

    def held(self) -> list[Execution]:
        with self._lock:
            return list(self._held.values())

    def held_by_job(self, job_ids: Iterable[int]) -> list[Execution]:
        """The held runs of these jobs (a cancel request names jobs, not runs)."""
        wanted = set(job_ids)
        with self._lock:
            return [e for (job_id, _), e in self._held.items() if job_id in wanted]

    def executing(self) -> list[Execution]:
        with self._lock:
            return list(self._executing.values())

    def busy(self) -> int:
        """Runs that occupy a slot or wait for one (not those only waiting for their write)."""
        with self._lock:
            return len(self._queued) + len(self._executing)

    def unwritten(self) -> int:
        """Runs that ended and wait for their verdict's write."""
        return self.busy_and_unwritten()[1]

    def busy_and_unwritten(self) -> tuple[int, int]:
        """`busy()` and `unwritten()` in one look (the claim loop's, every turn)."""
        with self._lock:
            busy = len(self._queued) + len(self._executing)
            return busy, len(self._held) - busy

    def idle(self) -> bool:
        with self._lock:
            return not self._held

    def held_kinds(self) -> Counter[str]:
        with self._lock:
            return Counter(execution.job.kind for execution in self._held.values())
