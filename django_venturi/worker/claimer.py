"""The claim loop: claims due jobs into free handler slots, recovers expired leases
and the dependents a killed worker left waiting, and runs the periodic scheduler.
It runs in the worker's main thread.

Each step goes through `DatabaseHealth.guarded`: a lost database, a deadlock,
a refused statement or a bug in one step is logged, and the loop goes on after
a short delay. The loop ends when the worker is asked to stop, when a burst
worker finds nothing more to do, or when the supervisor saw a service die.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from django.db import connections

from django_venturi.conf import venturi_settings
from django_venturi.registry import registry
from django_venturi.states import State
from django_venturi.store import dependencies, leases, stuck_claims, waiting_workers
from django_venturi.store.claim import (
    Claimed,
    ClaimedJob,
    ClaimRequest,
    KindLimit,
    claim,
    prime_claim_session,
    seconds_until_next_due,
    upcoming,
)
from django_venturi.store.connections import unavailable
from django_venturi.store.notify import wake_workers
from django_venturi.store.rate_limits import RateRule
from django_venturi.store.scheduling import TierClock
from django_venturi.store.verdicts import Verdict
from django_venturi.worker.execution import Execution
from django_venturi.worker.handlers import Handlers
from django_venturi.worker.idle_polls import IdlePolls
from django_venturi.worker.liveness import CLAIM_LOOP, Progress
from django_venturi.worker.pause_watch import PauseWatch
from django_venturi.worker.runs import Runs
from django_venturi.worker.scheduler import Scheduler
from django_venturi.worker.supervision import DatabaseHealth, Streak
from django_venturi.worker.wake_order import Call, WakeOrder

T = TypeVar("T")

logger = logging.getLogger("django_venturi.worker")

PREFETCH_FACTOR = 2
"""A worker holds up to this many times `concurrency` jobs: the rest wait in a local
buffer, so handler threads never wait for a claim round trip."""
BUFFER_HORIZON = 0.05
"""Short jobs are claimed further ahead: up to `batch_size` more, as long as the
buffered jobs wait no more than about this many seconds for a handler slot
(judged by the recent mean handler duration). Fewer, larger claims per job."""
UNWRITTEN_ALLOWANCE = 500
"""Verdicts waiting to be written beyond this many hold claims back."""
COUNTED_LATER_WAITS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
"""How long to wait before claiming capped and rate-limited kinds again after a claim
left them for later (another claim held the caps lock: see `store/claim.py`), by how
many claims in a row did; each wait is drawn between half and all of it, so that
workers that met at the lock do not meet there again."""


class Claimer:
    """The claim loop of one worker."""

    def __init__(
        self,
        *,
        worker: str,
        alias: str,
        queues: Sequence[str] | None,
        batch_size: int,
        poll_interval: float,
        burst: bool,
        kind_concurrency: dict[str, int],
        tasks_kind_prefix: str | None,
        runs: Runs,
        handlers: Handlers,
        health: DatabaseHealth,
        stop: threading.Event,
        wake: threading.Event,
        make_execution: Callable[[ClaimedJob, float], Execution],
        service_died: Callable[[], bool],
        pause_watch: PauseWatch,
        listening: Callable[[], bool],
        wake_order: WakeOrder | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.worker = worker
        self.progress = progress or Progress()
        self.alias = alias
        self.queues = queues
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self._idle_polls = IdlePolls(poll_interval)
        self._notified = connections[alias].vendor == "postgresql"
        self.burst = burst
        self.kind_concurrency = kind_concurrency
        self.tasks_kind_prefix = tasks_kind_prefix
        self.runs = runs
        self.handlers = handlers
        self.health = health
        self._stop = stop
        self._wake = wake
        self._make_execution = make_execution
        self._service_died = service_died
        self.pause_watch = pause_watch
        self._clock = TierClock(venturi_settings.PRIORITY_WEIGHTS, venturi_settings.QUEUE_WEIGHTS)
        self.rescue_interval = venturi_settings.RESCUE_INTERVAL.total_seconds()
        self._streak = Streak()
        self._listening = listening
        self.wake_order = wake_order
        self._unanswered_claims: list[uuid.UUID] = []
        """Tokens of claims that failed on the connection: the server may have run them."""
        self._drained = False
        """The last claim came back short without passing over jobs of capped or
        rate-limited kinds: it took every job that was due."""
        self._quiet = False
        """Drained, and new jobs announce themselves (NOTIFY): finishing runs do not wake
        the loop, nor do writes of verdicts that make no job claimable (each such wake
        cost an empty claim)."""
        self._counted_later = 0
        """Claims in a row that left capped and rate-limited kinds for later."""
        self._waiting = False
        """Marked waiting in the registry: enqueues of its queues NOTIFY after their commit
        (`store/waiting_workers.py`)."""
        self._recheck = False
        """Just marked waiting: claim once more, whatever the room, before sleeping."""
        self._recheck_at = float("inf")
        """When to claim again after the mark (`time.monotonic()`): producers that looked
        just before it remember for a moment that nobody waited (`waiting_workers.py`)."""

    def _guarded(self, action: Callable[[], T], what: str) -> T | None:
        """A step of the loop; after a failure, wait before the loop goes on."""
        result = self.health.guarded(action, what=what, streak=self._streak)
        if result is None and self._streak.count:
            self.progress.waiting(CLAIM_LOOP)
            self._stop.wait(self.health.delay(self._streak.count))
            self.progress.working(CLAIM_LOOP)
        return result

    def _release_unanswered(self) -> None:
        """Hand back the jobs of claims whose answer the connection lost, if it ran."""
        released = leases.release_unanswered(self.alias, self.worker, self._unanswered_claims)
        self._unanswered_claims = []
        if released:
            logger.warning(
                "worker %s handed back %d jobs of a claim whose answer the connection lost",
                self.worker,
                len(released),
                extra={"worker": self.worker},
            )

    def loop(self) -> None:
        with self.progress.watching(CLAIM_LOOP):
            self._loop()

    def _loop(self) -> None:
        next_rescue = 0.0
        scheduler = None if self.burst else Scheduler(self.alias)
        next_periodic = 0.0 if scheduler is not None else float("inf")
        while not self._stop.is_set() and not self._service_died():
            self.progress.working(CLAIM_LOOP)
            self._wake.clear()
            if time.monotonic() >= self._recheck_at:
                self._recheck, self._recheck_at = True, float("inf")
            calls = self.wake_order.take() if self.wake_order is not None else []
            if self._unanswered_claims:
                self._guarded(self._release_unanswered, "handing back an unanswered claim")
            if time.monotonic() >= next_rescue:
                self._guarded(
                    lambda: leases.recover_expired(self.alias, self.worker),
                    "recovering expired leases",
                )
                self._guarded(self._recover_stranded, "resolving stranded dependents")
                if self._counts_caps():
                    self._guarded(
                        lambda: stuck_claims.end_stuck_holders(self.alias),
                        "ending claims stuck mid-pipeline",
                    )
                next_rescue = time.monotonic() + self.rescue_interval
            if self.pause_watch.due():
                self._guarded(self.pause_watch.look, "looking for paused queues and kinds")
            if scheduler is not None and time.monotonic() >= next_periodic:
                self._guarded(scheduler.run_pass, "the periodic scheduler")
                next_periodic = time.monotonic() + scheduler.interval
            capacity = self._capacity()
            busy, held_back = self._load()
            free = capacity - busy - held_back
            # Claim in batches of at least `concurrency` (at least half the local
            # buffer), not one claim per finished job.
            threshold = 1 if self._recheck else max(self.handlers.concurrency, capacity // 2)
            self._recheck = False
            request = self._request(free) if free >= threshold else None
            claimed = None if request is None else self._claim(request)
            if request is not None and claimed is not None and self._mark_waiting(request, claimed):
                continue  # the claim after the mark: nothing committed before it is missed
            if calls and (request is None or claimed is None or _full(request, claimed)):
                self._hand_on(calls)  # no room, or more may be due than this claim took
            if request is not None and claimed is not None and self._after_claim(request, claimed):
                continue
            if self.burst and not claimed and self.runs.idle():
                if self._confirm_nothing_due():
                    return
                continue
            # A finishing run wakes the loop once there is room to claim into again,
            # unless nothing was due and new jobs will announce themselves.
            self._quiet = self._drained and held_back == 0 and not self.burst and self._listening()
            self.handlers.wake_at_busy = -1 if self._quiet else capacity - threshold - held_back
            if request is None and self.runs.busy() <= self.handlers.wake_at_busy:
                continue  # runs finished since the room was counted
            # Nothing due: sleep until the next poll or scheduled job. Otherwise all
            # slots are busy, and a finishing job wakes the loop. Capped and rate-limited
            # kinds left for later are claimed again shortly, whatever else is due.
            if self._counted_later and claimed is not None:
                wait = self._counted_later_wait()
            else:
                wait = self._idle_wait() if claimed == [] else self.poll_interval
            # Never sleep past the next recovery sweep, scheduler pass or pause look.
            next_chore = min(
                next_rescue,
                next_periodic,
                self.pause_watch.next_look,
                self._next_hand_on(),
                self._recheck_at,
            )
            self.progress.waiting(CLAIM_LOOP)
            self._wake.wait(min(wait, max(0.0, next_chore - time.monotonic())))

    def _recover_stranded(self) -> None:
        """Resolve the dependents of finished jobs whose verdict's worker died before
        resolving them (see `dependencies.recover_stranded`)."""
        recovered = dependencies.recover_stranded(self.alias)
        if recovered:
            logger.warning(
                "resolved the dependents of %d finished job(s) left unresolved "
                "(a worker stopped between a verdict and its resolve): %s",
                len(recovered),
                ", ".join(f"#{job_id}" for job_id in recovered),
                extra={"jobs": recovered},
            )

    def _counts_caps(self) -> bool:
        """Whether this worker's claims take the caps lock (it registers a globally
        capped or rate-limited kind): then it also ends claims stuck holding it."""
        return self._request(1).serialised

    # ------------------------------------------------------------ wake-up calls

    def hand_on_calls(self) -> None:
        """Hand every call this worker got on to the next workers (it is stopping)."""
        if self.wake_order is not None:
            calls = self.wake_order.take()
            if calls:
                self._hand_on(calls)

    def _hand_on(self, calls: Sequence[Call]) -> None:
        """Wake the next workers of the group for calls this worker did not answer."""
        assert self.wake_order is not None
        payloads = self.wake_order.hand_on(calls)
        if payloads:
            self.health.guarded(
                lambda: wake_workers(self.alias, payloads), what="calling the next workers"
            )

    def _next_hand_on(self) -> float:
        """When a deferred call is to be handed on (`time.monotonic()`), or infinity."""
        due = None if self.wake_order is None else self.wake_order.next_deferred()
        return float("inf") if due is None else due

    # ------------------------------------------------------------ waiting for wake-ups

    def _mark_waiting(self, request: ClaimRequest, claimed: Claimed) -> bool:
        """Keep the registry's waiting mark: set after a claim that came back short (room
        left, nothing more due), cleared after one that came back full (behind: runs
        finishing call the next claims). True if just set: claim once more before
        sleeping, for the jobs committed before the mark, whose enqueues saw none."""
        if self.wake_order is None or self.burst:
            return False  # no NOTIFY (SQLite, MariaDB), or a worker that ends when drained
        waiting = not _full(request, claimed)
        if waiting == self._waiting:
            return False
        marked = self.health.guarded(
            lambda: waiting_workers.mark(self.alias, self.worker, waiting=waiting),
            what="marking the worker waiting" if waiting else "clearing its waiting mark",
        )
        if not marked:
            return False  # tried again after the next claim
        self._waiting = self._recheck = waiting
        if waiting:
            self._recheck_at = time.monotonic() + waiting_workers.NOT_WAITING_MEMORY
        return waiting

    def registered(self) -> None:
        """The registry row was written afresh (not waiting): claim, and mark it again."""
        self._waiting = False
        self._wake.set()

    # ------------------------------------------------------------ claiming

    def _after_claim(self, request: ClaimRequest, claimed: Claimed) -> bool:
        """Note whether the claim drained what was due; return whether to claim again
        before waiting: the claim came back full (more may be due), or short having
        passed over jobs of capped or rate-limited kinds, which may have taken the
        places of other kinds' jobs. Short otherwise: nothing more is due now."""
        full = _full(request, claimed)
        self._drained = not full and not claimed.left_behind
        return bool(claimed) and (full or claimed.left_behind)

    def claim_after(self, written: Sequence[Verdict]) -> bool:
        """Whether these verdicts, just written, call for a claim: always, unless the loop
        is quiet and none of them made a job claimable (a requeue, the verdict of a
        keyed job, whose follow-up may have waited for it, or of a capped kind's, whose
        place a waiting job of its kind may take)."""
        return not self._quiet or any(
            verdict.state == State.READY or verdict.job.keyed or self._capped(verdict.job.kind)
            for verdict in written
        )

    def _capped(self, kind: str) -> bool:
        spec = registry.find(kind)
        return kind in self.kind_concurrency or (spec is not None and spec.concurrency is not None)

    def _claim(self, request: ClaimRequest) -> Claimed | None:
        token = uuid.uuid4()

        def claim_and_dispatch() -> Claimed:
            try:
                jobs = claim(self.alias, request, self._clock, token)
            except Exception as error:
                if unavailable(error):  # applied or not: the answer is lost
                    self._unanswered_claims.append(token)
                raise
            for job in jobs:
                # From the claim's database time, not from its return: a run's start
                # is that time plus how long the job waited (`Execution.mark_started`).
                self.handlers.dispatch(self._make_execution(job, job.claim_sent))
            return jobs

        jobs = self._guarded(claim_and_dispatch, "claiming jobs")
        if jobs is not None:
            self._counted_later = self._counted_later + 1 if jobs.counted_later else 0
        if jobs:
            self._idle_polls.jobs_flowed()
        return jobs

    def _counted_later_wait(self) -> float:
        """How long to wait before claiming the kinds the last claim left for later."""
        wait = COUNTED_LATER_WAITS[min(self._counted_later, len(COUNTED_LATER_WAITS)) - 1]
        return random.uniform(wait / 2, wait)  # noqa: S311 (spreads retries, no secret)

    def _request(self, free: int) -> ClaimRequest:
        kinds = registry.kinds()
        return ClaimRequest(
            worker=self.worker,
            limit=min(free, self.batch_size),
            kinds=kinds,
            leases=[registry.get(kind).lease or venturi_settings.DEFAULT_LEASE for kind in kinds],
            queues=self.queues,
            limits=self._kind_limits(kinds),
            kind_prefix=self.tasks_kind_prefix,
            prefix_lease=venturi_settings.DEFAULT_LEASE,
            rates=self._rates(kinds),
            fair_kinds=[kind for kind in kinds if registry.get(kind).fair_by is not None],
            start_room=self.handlers.slots() - self.runs.busy(),
        )

    @staticmethod
    def _rates(kinds: Sequence[str]) -> list[RateRule]:
        rules = []
        for kind in kinds:
            limit = registry.get(kind).rate_limit
            if limit is not None:
                rules.append(RateRule(kind, limit))
        return rules

    def _kind_limits(self, kinds: Sequence[str]) -> list[KindLimit]:
        held = self.runs.held_kinds()
        limits = []
        for kind in kinds:
            cap = registry.get(kind).concurrency
            local_cap = self.kind_concurrency.get(kind)
            if cap is not None or local_cap is not None:
                limits.append(
                    KindLimit(
                        kind,
                        global_cap=None if cap is None else cap.limit,
                        local_room=None if local_cap is None else local_cap - held[kind],
                        key=None if cap is None else cap.key,
                    )
                )
        return limits

    def _idle_wait(self) -> float:
        """Sleep until the next poll, or until a job scheduled sooner than that is due."""
        request = self._request(1)
        until_due = self.health.guarded(
            lambda: seconds_until_next_due(self.alias, request),
            what="looking for the next due job",
        )
        # That look is planned for its values; the lean claim's session comes back
        # now, while idle, not in the round trips of the next wake-up's claim.
        self.health.guarded(
            lambda: prime_claim_session(self.alias, request), what="setting up the claim"
        )
        # PostgreSQL's workers are woken by NOTIFY; elsewhere they poll, soon after jobs
        # flowed and less often as the quiet goes on (`idle_polls.py`).
        poll = self.poll_interval if self._notified else self._idle_polls.next_wait()
        if until_due is None:
            return poll
        return min(poll, max(until_due, 0.005))

    def _capacity(self) -> int:
        """Jobs held at once: a handler slot each, plus those buffered, claimed ahead.

        At least as many buffered as slots; for short jobs up to `batch_size`, so
        long as the buffer holds no more than BUFFER_HORIZON seconds of work.
        """
        slots = self.handlers.slots()
        ahead = slots * (PREFETCH_FACTOR - 1)
        mean = self.handlers.mean_duration
        if mean is not None:
            within_horizon = int(slots * BUFFER_HORIZON / max(mean, 1e-6))
            ahead = max(ahead, min(self.batch_size, within_horizon))
        return slots + ahead

    def _load(self) -> tuple[int, int]:
        """Runs in slots and buffer, and how many claims the results writer's lag holds back.

        Verdicts waiting to be written beyond UNWRITTEN_ALLOWANCE hold claims
        back, so a slow database never lets held jobs (and memory) pile up.
        """
        busy, unwritten = self.runs.busy_and_unwritten()
        return busy, max(0, unwritten - UNWRITTEN_ALLOWANCE)

    def _confirm_nothing_due(self) -> bool:
        """In burst mode: after the last verdicts are written, is anything due?

        Due jobs held back by a rate limit count: the worker waits for the window
        to open and runs them (jobs of paused queues and kinds do not count)."""
        free = self._capacity() - self.runs.busy()
        claimed = self._claim(self._request(free))
        if claimed is not None and claimed.counted_later:
            self._stop.wait(self._counted_later_wait())  # capped kinds may still be due
            return False
        if claimed is None or claimed or not self.runs.idle():
            return False
        waiting = self._guarded(
            lambda: upcoming(self.alias, self._request(1)), "looking for rate-limited jobs"
        )
        if waiting is None:
            return False
        if waiting.rate_opening is not None:
            self._stop.wait(max(waiting.rate_opening, 0.005))
            return False
        return True


def _full(request: ClaimRequest, claimed: Sequence[ClaimedJob]) -> bool:
    """Whether a claim took as many jobs as it asked for: more may be due."""
    return len(claimed) >= request.limit
