"""Tasks of the scheduling tests, found through VENTURI["TASK_MODULES"]."""

from __future__ import annotations

import dataclasses
import time

import django_venturi as venturi
from tests.testapp.tasks import record


def timed(ctx: venturi.Context, kind: str, seconds: float) -> None:
    """Record the wall-clock start and end of the run (one machine: clocks agree)."""
    start = time.time()
    time.sleep(seconds)
    record(ctx, kind, {"start": start, "end": time.time()})


@venturi.task(kind="tests.capped", concurrency=2)
@dataclasses.dataclass
class Capped(venturi.Task):
    seconds: float = 0.2

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        timed(ctx, "capped", self.seconds)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.key_capped", concurrency=venturi.Concurrency(2, key="account"))
@dataclasses.dataclass
class KeyCapped(venturi.Task):
    """At most 2 running per account; `retry_first`: its first run asks for a retry."""

    account: str = ""
    seconds: float = 0.1
    retry_first: bool = False

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        start = time.time()
        time.sleep(self.seconds)
        record(ctx, f"key_capped:{self.account}", {"start": start, "end": time.time()})
        if self.retry_first and ctx.attempt == 1:
            return venturi.Outcome.retry(after=0)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.fair", fair_by="account")
@dataclasses.dataclass
class Fair(venturi.Task):
    """Its jobs take turns by account; records its account and start."""

    account: str = ""
    n: int = 0
    seconds: float = 0.0

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "fair", {"account": self.account, "n": self.n, "t": time.time()})
        time.sleep(self.seconds)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.fair_latest", fair_by="account")
@dataclasses.dataclass
class FairLatest(venturi.Task):
    """A fair kind with a dedup key whose merge keeps the latest payload."""

    name: str
    account: str

    def dedup_key(self) -> str | None:
        return self.name

    def merge(self, existing: venturi.Existing[FairLatest]) -> venturi.Merge:
        return venturi.Merge.replace()

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@venturi.task(kind="tests.uncapped")
@dataclasses.dataclass
class Uncapped(venturi.Task):
    seconds: float = 0.05

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        timed(ctx, "uncapped", self.seconds)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.stamped")
@dataclasses.dataclass
class Stamped(venturi.Task):
    """Records when its handler started."""

    label: str = ""

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        from tests.testapp.models import Record

        Record.objects.using(ctx.database).create(
            job_id=ctx.job_id, kind="stamped", attempt=ctx.attempt, value={"t": time.time()}
        )
        return venturi.Outcome.completed()
