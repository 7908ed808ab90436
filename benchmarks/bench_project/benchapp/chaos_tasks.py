"""The chaos soak's tasks (benchmarks/chaos.py): one of each kind of job a fault can hurt.

Every run first appends `kind job attempt pid time` to the runs file named by
VENTURI_CHAOS_RUNS (one O_APPEND write: whole lines from every process), so the
soak can count every run that started, whatever became of it: at-least-once is
checked against these lines. Atomic runs also write a `Counter` row whose value is
the job id in the handler's transaction: exactly once is checked against those rows.

Leases are short (3 s) so that lost claims come back within a soak; attempts are
many, so that no job gives up under faults (a `failed` job is a violation).
"""

from __future__ import annotations

import dataclasses
import os
import time
from datetime import timedelta

import django_venturi as venturi
from benchmarks.bench_project.benchapp.models import Counter

RUNS_ENV = "VENTURI_CHAOS_RUNS"
LEASE = timedelta(seconds=3)
RATE = venturi.RateLimit(20, per=timedelta(seconds=1))
"""chaos.limited: at most 20 starts a second across the fleet."""
CAP = 2
"""chaos.capped: at most 2 running at once across the fleet."""
COMMON = {
    "lease": LEASE,
    "backoff": venturi.Fibonacci(base=timedelta(milliseconds=200), cap=timedelta(seconds=2)),
    "max_attempts": 10_000,
}


def record_run(ctx: venturi.Context, kind: str) -> None:
    """Append this run's line to the runs file."""
    line = f"{kind} {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(os.environ[RUNS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@venturi.task(kind="chaos.plain", **COMMON)
@dataclasses.dataclass
class Plain(venturi.Task):
    """Completes after a short sleep: at least once."""

    n: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_run(ctx, "plain")
        time.sleep(0.02)
        return venturi.Outcome.completed()


@venturi.task(kind="chaos.atomic", atomic=True, **COMMON)
@dataclasses.dataclass
class Atomic(venturi.Task):
    """Writes its effect (a Counter row, value = job id) in the verdict's transaction:
    a completed job has exactly one, any other none."""

    n: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_run(ctx, "atomic")
        Counter.objects.using(ctx.database).create(value=ctx.job_id)
        time.sleep(0.02)
        return venturi.Outcome.completed()


@venturi.task(kind="chaos.keyed", **COMMON)
@dataclasses.dataclass
class Keyed(venturi.Task):
    """Keyed: an enqueue meeting a waiting job adds its `count` to it, one meeting a
    running job queues a follow-up. Completed jobs' counts sum to the enqueues."""

    key: str
    count: int = 1

    def dedup_key(self) -> str | None:
        return f"chaos:{self.key}"

    def merge(self, existing: venturi.Existing[Keyed]) -> venturi.Merge:
        if existing.state == venturi.State.RUNNING:
            return venturi.Merge.enqueue()
        merged = dataclasses.replace(existing.payload, count=existing.payload.count + self.count)
        return venturi.Merge.update(merged)

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_run(ctx, "keyed")
        time.sleep(0.02)
        return venturi.Outcome.completed()


@venturi.task(kind="chaos.step", **COMMON)
@dataclasses.dataclass
class Step(venturi.Task):
    """A step of a workflow chain: runs only once the step before it completed."""

    chain: int
    index: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_run(ctx, "step")
        time.sleep(0.02)
        return venturi.Outcome.completed()


@venturi.task(kind="chaos.limited", rate_limit=RATE, **COMMON)
@dataclasses.dataclass
class Limited(venturi.Task):
    """Rate-limited: held `ready` while the fleet is over the limit."""

    n: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_run(ctx, "limited")
        return venturi.Outcome.completed()


@venturi.task(kind="chaos.capped", concurrency=CAP, **COMMON)
@dataclasses.dataclass
class Capped(venturi.Task):
    """Capped: at most CAP running across the fleet (the caps advisory lock)."""

    n: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_run(ctx, "capped")
        time.sleep(0.2)
        return venturi.Outcome.completed()


@venturi.task(kind="chaos.slow", **COMMON)
@dataclasses.dataclass
class Slow(venturi.Task):
    """Runs `seconds`, watching `should_stop` (a cancel, a shutdown, a lost lease): the
    soak's cancels and pauses land on these while they run."""

    seconds: float

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record_run(ctx, "slow")
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            if ctx.should_stop:
                return venturi.Outcome.paused(None)
            time.sleep(0.05)
        return venturi.Outcome.completed()
