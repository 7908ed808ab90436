"""Tasks of the tests that restart PostgreSQL or kill workers (private clusters only).

Each run appends `job attempt pid` to a file first (one O_APPEND write, whole
lines even from many processes), so a test counts every run that started,
whatever became of it: the side effect the journal must account for.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import django_venturi as venturi
from tests.testapp.models import Record
from tests.testapp.tasks import NO_WAIT, append_run, wait_for_file

MODULE = __name__
"""For the workers' TASK_MODULES (tests/cluster_workers.py)."""


@venturi.task(kind="soak.journalled", lease=timedelta(seconds=3), backoff=NO_WAIT, max_attempts=50)
@dataclasses.dataclass
class Journalled(venturi.Task):
    """Records its run, uses the database as handlers do (a Record), sleeps, completes.

    With the database away the insert raises: the run ends as a retry.
    """

    path: str
    sleep: float = 0.01

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        Record.objects.using(ctx.database).create(
            job_id=ctx.job_id, kind="journalled", attempt=ctx.attempt
        )
        time.sleep(self.sleep)
        return venturi.Outcome.completed()


# ---------------------------------------------------------------- the chaos soak (tests/soak.py)

SOAK = {"lease": timedelta(seconds=3), "backoff": NO_WAIT, "max_attempts": 200}
"""Workers are SIGKILLed every second or so: a job may lose many claims before it ends."""


@venturi.task(kind="soak.steps", carry=int, **SOAK)
@dataclasses.dataclass
class Steps(venturi.Task):
    """Pauses with its progress as carry until `steps` runs are done."""

    path: str
    steps: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        done = (ctx.carry or 0) + 1
        time.sleep(0.01)
        return venturi.Outcome.completed() if done >= self.steps else venturi.Outcome.paused(done)


@venturi.task(kind="soak.flaky", **SOAK)
@dataclasses.dataclass
class Flaky(venturi.Task):
    """Raises on its first `failures` attempts (retried at once), then completes."""

    path: str
    failures: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        if ctx.attempt <= self.failures:
            raise RuntimeError(f"soak failure {ctx.attempt}")
        return venturi.Outcome.completed()


@venturi.task(kind="soak.tally", **SOAK)
@dataclasses.dataclass
class Tally(venturi.Task):
    """Keyed: an enqueue that meets a waiting job adds its `count` to it; one that meets a
    running job queues a follow-up. Completed jobs' counts sum to the enqueues."""

    path: str
    key: str
    count: int = 1

    def dedup_key(self) -> str | None:
        return f"soak:{self.key}"

    def merge(self, existing: venturi.Existing[Tally]) -> venturi.Merge:
        if existing.state == venturi.State.RUNNING:
            return venturi.Merge.enqueue()
        merged = dataclasses.replace(existing.payload, count=existing.payload.count + self.count)
        return venturi.Merge.update(merged)

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        time.sleep(0.01)
        return venturi.Outcome.completed()


@venturi.task(kind="soak.slow", **SOAK)
@dataclasses.dataclass
class Slow(venturi.Task):
    """Runs `seconds`, watching `should_stop` (a cancel request, a shutdown)."""

    path: str
    seconds: float

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            if ctx.should_stop:
                return venturi.Outcome.paused(None)
            time.sleep(0.02)
        return venturi.Outcome.completed()


# ---------------------------------------------------------------- a read-only window


@venturi.task(kind="soak.once", max_attempts=1)
@dataclasses.dataclass
class Once(venturi.Task):
    """One attempt, the default lease: a verdict the database refused and the worker then
    dropped would leave it `running` for minutes and end it `failed`."""

    path: str

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        return venturi.Outcome.completed()


@venturi.task(kind="soak.gated", max_attempts=1)
@dataclasses.dataclass
class Gated(venturi.Task):
    """Records its run, then holds its handler until the file `gate` exists (60 s at
    most) and completes: its verdict is written at the moment a test chooses."""

    path: str
    gate: str

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        append_run(ctx, self.path)
        wait_for_file(self.gate)
        return venturi.Outcome.completed()
