"""Tasks for cancel, timeout and progress tests: long runs that report what they saw."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta

import django_venturi as venturi
from tests.testapp.tasks import NO_WAIT, record


@venturi.task(kind="tests.cancellable")
@dataclasses.dataclass
class Cancellable(venturi.Task):
    """Runs until asked to stop; records when it saw the request; returns `completed`."""

    seconds: float = 60

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "cancellable_started")
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline and not ctx.should_stop:
            time.sleep(0.005)
        record(ctx, "cancellable_stopped", {"at": time.time(), "cancel": ctx.cancel_requested})
        return venturi.Outcome.completed()


@venturi.task(
    kind="tests.ignores_timeout", timeout=timedelta(seconds=1), backoff=NO_WAIT, max_attempts=2
)
@dataclasses.dataclass
class IgnoresTimeout(venturi.Task):
    """Sleeps past its timeout and its grace, ignoring `should_stop`."""

    seconds: float

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "ignores_timeout_started", time.time())
        time.sleep(self.seconds)
        record(ctx, "ignores_timeout_returned", time.time())
        return venturi.Outcome.completed()


@venturi.task(
    kind="tests.honours_timeout", timeout=timedelta(seconds=0.5), backoff=NO_WAIT, max_attempts=1
)
@dataclasses.dataclass
class HonoursTimeout(venturi.Task):
    """Stops when its timeout asks it to, by raising (a retryable failure)."""

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        while not ctx.should_stop:
            time.sleep(0.01)
        record(ctx, "honours_timeout", {"timed_out": ctx.timed_out})
        raise RuntimeError("stopped at the timeout")


@venturi.task(
    kind="tests.async_timeout", timeout=timedelta(seconds=0.5), backoff=NO_WAIT, max_attempts=1
)
@dataclasses.dataclass
class AsyncTimeout(venturi.Task):
    async def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            from asgiref.sync import sync_to_async

            await sync_to_async(record)(ctx, "async_timeout_cancelled")
            raise
        return venturi.Outcome.completed()


@venturi.task(kind="tests.reports_progress")
@dataclasses.dataclass
class ReportsProgress(venturi.Task):
    """Reports progress every 10 ms for `steps` steps, then completes."""

    steps: int
    step_seconds: float = 0.01

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        for done in range(1, self.steps + 1):
            time.sleep(self.step_seconds)
            ctx.progress(done, self.steps, note=f"step {done}")
            if ctx.should_stop:
                return venturi.Outcome.paused(None)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.checkpoints", carry=int)
@dataclasses.dataclass
class Checkpoints(venturi.Task):
    """Never done: each run works `step_seconds`, then checkpoints with `Outcome.paused`."""

    step_seconds: float = 0.002

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        time.sleep(self.step_seconds)
        return venturi.Outcome.paused((ctx.carry or 0) + 1)


@venturi.task(kind="tests.keeps_failing", backoff=NO_WAIT, max_attempts=1_000_000_000)
@dataclasses.dataclass
class KeepsFailing(venturi.Task):
    """Never done: each run works `step_seconds`, then fails (retried at once, never gives up)."""

    step_seconds: float = 0.002

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        time.sleep(self.step_seconds)
        if ctx.attempt % 2:
            raise RuntimeError("fails every run")
        return venturi.Outcome.retry()
