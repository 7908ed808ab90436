"""Real database errors at each place of a real worker: it goes on, or exits cleanly.

A matrix of place x error class (tests/injection.py says how each error is
made: triggers on venturi's tables that fail the statement of one place, with
errors PostgreSQL itself raises). Each case runs a real `venturi_worker`
subprocess over a small backlog, a few jobs of which a vanished worker still
holds under expired leases; the armed place fails its next few statements.
Then one of two things must have happened:

- the worker went on: every job completed, including a few enqueued after the
  injection fired (so the worker still works afterwards), and SIGTERM stops it
  with exit code 0; or
- the worker exited by itself, non-zero, leaving no job `running`; then a
  fresh worker completes every job.

Either way its log names the database error (an error nobody hears of is a
silent failure), no thread may die of an uncaught exception, no job may be lost, each
job completes exactly once (one `completed` journal entry), and the worker never
hangs: each phase has a deadline. Only public behaviour is looked at: exit
codes, job rows, the journal and the log. Leases that lapsed are counted and
described, not asserted: three failing heartbeats in a row can outlast a 2 s
lease even for a correct worker, and the job then runs again, which
at-least-once allows.

The whole matrix takes about 3 minutes on a shared 2-core machine when every
cell passes (a failing cell costs its deadline), so the default suite runs a
covering share of it (DEFAULT_CELLS) and `python3 -m pytest -m thorough` the rest;
CI runs both. `-m '' -k verdict` or `-m '' -k deadlock` runs a whole row or column. With
`VENTURI_INJECTION_REPORT=<path>` each case appends its description to that file
(JSON lines): the matrix of what the worker does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

import django_venturi as venturi
from django_venturi.conf import venturi_settings
from django_venturi.models import Job, JournalEntry, ScheduleState
from django_venturi.states import FINISHED_STATES
from django_venturi.store.connections import connection_params
from tests.conftest import ROOT, Workers, worker_env
from tests.database import postgres_url
from tests.injection import (
    ERRORS,
    PLACES,
    UNCAUGHT,
    DeadlockPartner,
    Injection,
    LockHolder,
    names,
    statement_timeout_url,
)
from tests.testapp.injection_tasks import Injected

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

ALIAS = "default"
TIMES = 3
"""How many statements of the armed place fail."""
SHORT_JOBS = 16
GHOSTS = 4
"""Of the short jobs, how many a vanished worker holds (expired leases to recover)."""
VANISHED = "a-vanished-worker"
AFTER_JOBS = 4
"""Enqueued once the injection fired and the backlog is done: does the worker go on?"""
PHASE_DEADLINE = 15.0
"""Seconds a worker gets to finish the jobs (a behaving worker needs 2 to 10: heartbeat
cells run again the jobs whose lease lapsed)."""
STOP_DEADLINE = 15.0
"""Seconds a worker gets to exit after SIGTERM."""

CANNOT_OCCUR = {
    ("listener", error): (
        "the listener runs LISTEN once per connection and then only waits for "
        "notifications: it writes no data (data, integrity), takes no lock (deadlock, "
        "lock timeout), has no transaction to serialize and no statement running to "
        "time out; what reaches it is the loss of its connection"
    )
    for error in ERRORS
    if error != "connection"
}
"""Combinations that cannot occur, and why. Every other one can: a statement of each
place can meet a lock, a timeout, a lost connection, and (through a project's own
triggers or constraints on venturi's tables, or text a handler returns) data and
integrity errors."""

CELLS = [
    (place, error) for place in PLACES for error in ERRORS if (place, error) not in CANNOT_OCCUR
]

DEFAULT_CELLS = {
    *((place, "connection") for place in PLACES),
    ("verdict", "data"),
    ("verdict", "integrity"),
    ("heartbeat", "lock_timeout"),
    ("claim", "deadlock"),
    ("recovery", "serialization"),
    ("scheduler", "statement_timeout"),
}
"""The default suite's share: every place once (losing its connection) and every error
class once; the rest of the matrix is `thorough` (`python3 -m pytest -m thorough`, CI)."""


def cell(place: str, error: str) -> Any:
    marks = () if (place, error) in DEFAULT_CELLS else (pytest.mark.thorough,)
    return pytest.param(place, error, id=f"{place}-{error}", marks=marks)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """What a place needs to be reached: its jobs, settings and worker flags."""

    long_jobs: int = 0
    """Jobs of 2.5 s, longer than their lease (2 s): held across heartbeats."""
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    periodic: bool = False
    old_jobs: int = 0
    """Jobs completed a month ago, for retention to delete."""
    worker_args: tuple[str, ...] = ()
    first_reached_after: float = 0.0
    """When the place is first reached, in seconds after the worker starts."""


SCENARIOS = {
    "claim": Scenario(),
    # Heartbeats come every third of the shortest lease (2 s): hold jobs across a few.
    "heartbeat": Scenario(long_jobs=2),
    "verdict": Scenario(),
    "recovery": Scenario(),
    # The worker's own polls and recovery sweeps would hide a dead listener: make
    # them rare, so that the jobs enqueued after the listener's losses need it.
    "listener": Scenario(settings={"RESCUE_INTERVAL": 30}, worker_args=("--poll-interval", "30")),
    # The first sweep comes 5 s after the worker starts (sweeper.FIRST_SWEEP_AFTER).
    "sweeper": Scenario(
        settings={"RETENTION": {"completed": "1d"}}, old_jobs=3, first_reached_after=5.0
    ),
    # A yearly schedule: its latest tick is past, so the first pass enqueues it, once.
    "scheduler": Scenario(periodic=True),
}


# ------------------------------------------------------------ workers


class InjectedWorkers(Workers):
    """Workers run through tests.injection, which marks exceptions nothing caught."""

    def command(self, alias: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "tests.injection", "--database", alias, *args]

    def start_with(self, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        with open(self.tmp_path / f"worker-{len(self.processes)}.log", "wb") as log:
            process = subprocess.Popen(
                self.command(ALIAS, *args),
                env={**worker_env(), **env},
                cwd=ROOT,
                stdout=log,
                stderr=log,
            )
        self.processes.append(process)
        return process


@pytest.fixture
def injected_workers(tmp_path: Path) -> Iterator[InjectedWorkers]:
    pool = InjectedWorkers(tmp_path)
    yield pool
    pool.stop_all()


@pytest.fixture
def injection(transactional_db: None) -> Iterator[Injection]:
    armed = Injection(connection_params(ALIAS))
    yield armed
    armed.close()


def worker_settings(scenario: Scenario, runs: Path) -> dict[str, str]:
    """The environment that gives a worker the scenario's settings."""
    more = {
        "TASK_MODULES": [*venturi_settings.TASK_MODULES, "tests.testapp.injection_tasks"],
        **scenario.settings,
    }
    env = {"VENTURI_TEST_SETTINGS": json.dumps(more)}
    if scenario.periodic:
        yearly = {
            "task": "tests.injected",
            "cron": "0 0 1 1 *",
            "payload": {"path": str(runs), "sleep": 0.05},
        }
        env["VENTURI_TEST_PERIODIC"] = json.dumps([yearly])
    return env


# ------------------------------------------------------------ the database, seen from outside


def states(exclude: set[int]) -> Counter[str]:
    return Counter(Job.objects.using(ALIAS).exclude(pk__in=exclude).values_list("state", flat=True))


def unfinished(exclude: set[int]) -> int:
    return (
        Job.objects.using(ALIAS).exclude(pk__in=exclude).exclude(state__in=FINISHED_STATES).count()
    )


def running() -> int:
    """Jobs `running` under a claim of the test's workers (not the vanished one's)."""
    jobs = Job.objects.using(ALIAS).filter(state=venturi.State.RUNNING)
    return jobs.exclude(claimed_by=VANISHED).count()


def tick_job_exists() -> bool:
    return Job.objects.using(ALIAS).filter(periodic_tick__isnull=False).exists()


def listener_backends() -> list[int]:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%%'"
        )
        return [pid for (pid,) in cursor.fetchall()]


def terminate(pid: int) -> bool:
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        (done,) = cursor.fetchone()
    return bool(done)


def runs_per_job(path: Path) -> Counter[int]:
    """Job id -> how many times its handler ran (lines `job attempt pid`)."""
    return Counter(int(line.split()[0]) for line in path.read_text().splitlines())


# ------------------------------------------------------------ one case


@dataclasses.dataclass
class Phase:
    """One worker's life in a case, as seen from outside."""

    end: str = ""
    """`done` (every job finished), `exited` (by itself) or `hung` (deadline passed)."""
    seconds: float = 0.0
    rc: int | None = None
    """Exit code; None if it did not exit within STOP_DEADLINE of SIGTERM (then killed)."""
    left_unfinished: Counter[str] = dataclasses.field(default_factory=Counter)
    """States of the unfinished jobs when the phase ended (not `done`)."""
    tick_missing: bool = False
    """The periodic tick's job did not exist when the phase ended."""
    running_after: int = 0
    """Jobs `running` once the process was gone."""
    uncaught: list[str] = dataclasses.field(default_factory=list)
    names_the_error: bool = False


@dataclasses.dataclass
class Case:
    place: str
    error: str
    tmp_path: Path
    injection: Injection
    workers: InjectedWorkers
    scenario: Scenario = dataclasses.field(init=False)
    runs: Path = dataclasses.field(init=False)
    old: set[int] = dataclasses.field(default_factory=set)
    reached: int = 0
    killed: list[int] = dataclasses.field(default_factory=list)
    after_enqueued: bool = False
    first: Phase = dataclasses.field(default_factory=Phase)
    fresh: Phase | None = None
    not_completed: Counter[str] = dataclasses.field(default_factory=Counter)
    completed_entries: Counter[int] = dataclasses.field(default_factory=Counter)
    never_ran: int = 0
    ran_twice: int = 0
    leases_lost: int = 0
    """Runs of the test's workers whose lease expired (recovered as `lease_expired`)."""
    ghosts: set[int] = dataclasses.field(default_factory=set)
    jobs: int = 0

    def __post_init__(self) -> None:
        self.scenario = SCENARIOS[self.place]
        self.runs = self.tmp_path / "runs"
        self.runs.touch()

    # ---------------------------------------------------------- setting up

    def enqueue(self, count: int, sleep: float = 0.05) -> list[int]:
        jobs = venturi.enqueue_many(
            [Injected(path=str(self.runs), sleep=sleep) for _ in range(count)], using=ALIAS
        )
        return [job.pk for job in jobs]

    def set_up(self) -> None:
        if self.scenario.periodic:
            # The yearly schedule ran in earlier years: its latest tick is caught up.
            first_seen = datetime(2000, 1, 1, tzinfo=UTC)
            ScheduleState.objects.using(ALIAS).create(
                kind="tests.injected", first_seen_at=first_seen
            )
        ids = self.enqueue(SHORT_JOBS)
        self.enqueue(self.scenario.long_jobs, sleep=2.5)
        now = timezone.now()
        self.ghosts = set(ids[:GHOSTS])
        Job.objects.using(ALIAS).filter(pk__in=self.ghosts).update(
            state=venturi.State.RUNNING,
            attempt=1,
            claim_token=uuid.uuid4(),
            claimed_by=VANISHED,
            started_at=now - timedelta(seconds=10),
            lease_expires_at=now - timedelta(seconds=5),
        )
        for _ in range(self.scenario.old_jobs):
            job = Job.objects.using(ALIAS).create(
                kind="tests.injected",
                payload={"path": str(self.runs)},
                state=venturi.State.COMPLETED,
                attempt=1,
                finished_at=now - timedelta(days=30),
            )
            self.old.add(job.pk)

    def env(self, *, injected: bool) -> dict[str, str]:
        env = worker_settings(self.scenario, self.runs)
        # A worker that does not exit after SIGTERM gets SIGABRT before it is killed:
        # with the fault handler on, every thread's stack goes to its log.
        env["PYTHONFAULTHANDLER"] = "1"
        if injected and self.error == "statement_timeout":
            env["DATABASE_URL"] = statement_timeout_url(postgres_url())
        return env

    # ---------------------------------------------------------- running workers

    def kill_listener(self) -> None:
        """Terminate the worker's listener once it listens again, up to TIMES times."""
        if len(self.killed) >= TIMES:
            return
        for pid in listener_backends():
            if pid not in self.killed and terminate(pid):
                self.killed.append(pid)
                return

    def backlog_done(self) -> bool:
        if self.scenario.periodic and not tick_job_exists():
            return False
        return unfinished(self.old) == 0

    def count_reached(self) -> None:
        self.reached = len(self.killed) if self.place == "listener" else self.injection.reached()

    def heard_of(self, index: int) -> bool:
        """Whether the place was reached and worker `index` logged the error it met (the
        statement fails some time after it reached the trigger: a timeout's time)."""
        enough = self.reached >= (TIMES if self.place == "listener" else 1)
        return enough and names(self.error, self.workers.log(index))

    def watch(
        self, process: subprocess.Popen[bytes], index: int, deadline: float, *, injected: bool
    ) -> str:
        """Until every job is finished (and, injected, the error was met and logged), or
        the process exits, or the deadline passes."""
        while True:
            if process.poll() is not None:
                return "exited"
            if injected:
                if self.place == "listener":
                    self.kill_listener()
                self.count_reached()
            if self.backlog_done() and (not injected or self.heard_of(index)):
                if self.after_enqueued or not injected:
                    return "done"
                self.enqueue(AFTER_JOBS)
                self.after_enqueued = True
                continue
            if time.monotonic() > deadline:
                return "hung"
            time.sleep(0.05)

    def run_worker(self, *, injected: bool) -> Phase:
        index = len(self.workers.processes)
        args = (
            "--concurrency",
            "4",
            "--shutdown-timeout",
            "5",
            "--skip-checks",  # Django's system checks: not the subject, and 0.5 s a start
            *self.scenario.worker_args,
        )
        process = self.workers.start_with(self.env(injected=injected), *args)
        begun = time.monotonic()
        deadline = begun + PHASE_DEADLINE
        if injected:
            deadline += self.scenario.first_reached_after
        phase = Phase(end=self.watch(process, index, deadline, injected=injected))
        phase.seconds = time.monotonic() - begun
        if phase.end != "done":
            phase.left_unfinished = Counter(
                {state: n for state, n in states(self.old).items() if state not in FINISHED_STATES}
            )
            phase.tick_missing = self.scenario.periodic and not tick_job_exists()
        if phase.end == "exited":
            phase.rc = process.returncode
        else:
            process.send_signal(signal.SIGTERM)
            try:
                phase.rc = process.wait(timeout=STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGABRT)  # the threads' stacks, to the log
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        phase.running_after = running()
        log = self.workers.log(index)
        phase.uncaught = [line for line in log.splitlines() if line.startswith(UNCAUGHT)]
        phase.names_the_error = names(self.error, log)
        return phase

    def run(self) -> None:
        self.set_up()
        with ExitStack() as stack:
            params = connection_params(ALIAS)
            if self.error == "lock_timeout":
                stack.callback(LockHolder(params).close)
            if self.error == "deadlock":
                stack.callback(DeadlockPartner(params).close)
            if self.place != "listener":
                self.injection.arm(self.place, self.error, TIMES)
            self.first = self.run_worker(injected=True)
            self.injection.disarm()
            self.count_reached()
        if not self.backlog_done() or self.first.running_after:
            self.fresh = self.run_worker(injected=False)
        self.take_stock()

    def take_stock(self) -> None:
        live = Job.objects.using(ALIAS).exclude(pk__in=self.old)
        self.jobs = live.count()
        self.not_completed = Counter(
            live.exclude(state=venturi.State.COMPLETED).values_list("state", flat=True)
        )
        self.completed_entries = Counter(
            JournalEntry.objects.using(ALIAS)
            .filter(outcome="completed")
            .exclude(job_id__in=self.old)
            .values_list("job_id", flat=True)
        )
        expired = JournalEntry.objects.using(ALIAS).filter(outcome="lease_expired")
        self.leases_lost = sum(
            1
            for job_id, attempt in expired.values_list("job_id", "attempt")
            if not (job_id in self.ghosts and attempt == 1)
        )
        ran = runs_per_job(self.runs)
        ids = set(live.values_list("pk", flat=True))
        self.never_ran = len(ids - set(ran))
        self.ran_twice = sum(1 for job_id in ids if ran[job_id] > 1)

    # ---------------------------------------------------------- judging

    @property
    def expected_jobs(self) -> int:
        after = AFTER_JOBS if self.after_enqueued else 0
        return SHORT_JOBS + self.scenario.long_jobs + after + int(self.scenario.periodic)

    def first_worker_acceptable(self) -> bool:
        """Went on, or exited non-zero by itself; either way it said what went wrong."""
        first = self.first
        if first.uncaught or first.running_after or not first.names_the_error:
            return False
        if first.end == "done":
            return first.rc == 0
        return first.end == "exited" and first.rc != 0

    def acceptable(self) -> bool:
        fresh_ok = self.fresh is None or (self.fresh.end == "done" and self.fresh.rc == 0)
        every_job_once = (
            self.jobs >= self.expected_jobs
            and not self.not_completed
            and all(self.completed_entries[job_id] == 1 for job_id in self.completed_entries)
            and sum(self.completed_entries.values()) == self.jobs
            and self.never_ran == 0
        )
        return self.first_worker_acceptable() and fresh_ok and every_job_once

    def describe(self) -> str:
        """What the worker did, in a sentence or two (the matrix's cell)."""
        first = self.first
        fired = min(self.reached, TIMES)
        parts = [f"fired {fired}x (place reached {self.reached}x)"]
        if first.end == "done":
            parts.append(f"finished every job in {first.seconds:.1f} s")
        elif first.end == "exited":
            parts.append(f"exited {first.rc} by itself after {first.seconds:.1f} s")
        elif first.left_unfinished:
            left = ", ".join(f"{n} {state}" for state, n in sorted(first.left_unfinished.items()))
            parts.append(f"HANGS: after {first.seconds:.0f} s still {left}")
        elif self.reached == 0:
            parts.append(f"after {first.seconds:.0f} s the {self.place} was still not reached")
        elif first.tick_missing:
            parts.append(f"TICK LOST: after {first.seconds:.0f} s its job was never enqueued")
        else:
            parts.append(f"finished every job, waited {first.seconds:.0f} s for the error's log")
        if first.end != "exited":
            parts.append(
                "SIGTERM: no exit (killed)" if first.rc is None else f"SIGTERM: exit {first.rc}"
            )
        if first.running_after:
            parts.append(f"left {first.running_after} running")
        if not first.names_the_error:
            parts.append("its log does not name the error")
        parts.extend(line.removeprefix(UNCAUGHT).strip() for line in first.uncaught)
        if self.fresh is not None:
            fresh = self.fresh
            if fresh.end == "done" and fresh.rc == 0:
                parts.append(f"a fresh worker finished the rest in {fresh.seconds:.1f} s")
            else:
                parts.append(f"a fresh worker: {fresh.end}, exit {fresh.rc}")
        if self.not_completed:
            parts.append(f"not completed in the end: {dict(self.not_completed)}")
        twice = sum(1 for n in self.completed_entries.values() if n > 1)
        if twice:
            parts.append(f"{twice} jobs completed twice")
        if self.jobs < self.expected_jobs:
            parts.append(f"{self.expected_jobs - self.jobs} jobs lost")
        if self.never_ran:
            parts.append(f"{self.never_ran} jobs never ran")
        if self.ran_twice:
            parts.append(f"{self.ran_twice} jobs ran twice")
        if self.leases_lost:
            parts.append(f"{self.leases_lost} leases expired under the test's workers")
        return "; ".join(parts)

    def report(self) -> None:
        """Append this case to the file VENTURI_INJECTION_REPORT names, if set."""
        path = os.environ.get("VENTURI_INJECTION_REPORT")
        if not path:
            return
        line = {
            "place": self.place,
            "error": self.error,
            "ok": self.acceptable(),
            "what": self.describe(),
        }
        with open(path, "a") as report:
            report.write(json.dumps(line) + "\n")


@pytest.mark.parametrize(("place", "error"), [cell(place, error) for place, error in CELLS])
def test_a_worker_goes_on_or_exits_cleanly(
    place: str,
    error: str,
    tmp_path: Path,
    injection: Injection,
    injected_workers: InjectedWorkers,
) -> None:
    case = Case(place, error, tmp_path, injection, injected_workers)
    case.run()
    case.report()
    if place == "listener":
        assert case.reached == TIMES, "the worker's listener was not terminated each time"
    else:
        assert case.reached >= 1, f"the {place} was never reached: the case tests nothing"
    assert case.acceptable(), (
        case.describe()
        + "\n"
        + "\n".join(
            f"--- worker {index}:\n{injected_workers.log(index)[-3000:]}"
            for index in range(len(injected_workers.processes))
        )
    )


def test_the_default_share_of_the_matrix_covers_every_place_and_every_error() -> None:
    assert set(CELLS) >= DEFAULT_CELLS
    assert {place for place, _ in DEFAULT_CELLS} == set(PLACES)
    assert {error for _, error in DEFAULT_CELLS} == set(ERRORS)
