"""Tasks of the workflow tests: steps that record their order and pass results on."""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from pathlib import Path

import django_venturi as venturi
from tests.testapp.models import Record
from tests.testapp.tasks import NO_WAIT, wait_for_file


def record_step(ctx: venturi.Context, name: str) -> None:
    """A step's run: its name and the results of the jobs it waited for."""
    Record.objects.using(ctx.database).create(
        job_id=ctx.job_id,
        kind="step",
        attempt=ctx.attempt,
        value={"name": name, "seen": sorted(ctx.dependency_results().values(), key=str)},
    )


@venturi.task(kind="tests.workflow.step")
@dataclasses.dataclass
class Step(venturi.Task):
    name: str
    fail: bool = False

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_step(ctx, self.name)
        if self.fail:
            return venturi.Outcome.failed(f"{self.name} fails on purpose")
        return venturi.Outcome.completed(result=self.name)


@venturi.task(kind="tests.workflow.retried_step", max_attempts=3, backoff=NO_WAIT)
@dataclasses.dataclass
class RetriedStep(venturi.Task):
    """A step of the real-process workflow tests: records each attempt as `Step` does,
    raises on its first `failing` attempts (retried, three attempts at most), and may
    hold one attempt until a file exists."""

    name: str
    failing: int = 0
    """Attempts 1 to `failing` raise."""
    gate: str = ""
    """A file the attempt `held` waits for (a minute at most), after its record."""
    held: int = 0
    give_up: bool = False
    """Fail for good (`Outcome.failed`) instead of completing."""

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_step(ctx, self.name)
        if self.gate and ctx.attempt == self.held:
            wait_for_file(self.gate)
        if ctx.attempt <= self.failing:
            raise RuntimeError(f"{self.name} fails attempt {ctx.attempt}")
        if self.give_up:
            return venturi.Outcome.failed(f"{self.name} fails on purpose")
        return venturi.Outcome.completed(result=self.name)


@venturi.task(
    kind="tests.workflow.leased_step", max_attempts=3, backoff=NO_WAIT, lease=timedelta(seconds=2)
)
@dataclasses.dataclass
class LeasedStep(RetriedStep):
    """`RetriedStep` with a short lease: a run its killed worker left is recovered soon."""


@venturi.task(kind="tests.workflow.summary")
@dataclasses.dataclass
class Summary(venturi.Task):
    batch: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        results = ctx.dependency_results()
        Record.objects.using(ctx.database).create(
            job_id=ctx.job_id, kind="summary", attempt=ctx.attempt, value=len(results)
        )
        return venturi.Outcome.completed(result={"members": len(results)})


@venturi.task(
    kind="tests.atomic.write",
    atomic=True,
    lease=timedelta(seconds=2),
    max_attempts=3,
    backoff=venturi.Fibonacci(base=timedelta(0), cap=timedelta(0)),
)
@dataclasses.dataclass
class AtomicWrite(venturi.Task):
    """Writes a Record in its transaction; its first run may stall after the write."""

    stall_in: str = ""
    """A directory: the first run touches `written` there after its write, then waits
    (at most a minute) for `go` to appear."""
    fail: bool = False

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        Record.objects.using(ctx.database).create(
            job_id=ctx.job_id, kind="atomic", attempt=ctx.attempt, value=os.getpid()
        )
        if self.fail:
            raise RuntimeError("fails after its write")
        if self.stall_in and ctx.attempt == 1:
            folder = Path(self.stall_in)
            (folder / "written").touch()
            wait_for_file(folder / "go")
        return venturi.Outcome.completed(result=ctx.attempt)
