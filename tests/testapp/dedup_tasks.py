"""Tasks of the deduplication tests, found through VENTURI["TASK_MODULES"]."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime

from django.db import connections

import django_venturi as venturi
from tests.testapp.tasks import record


@venturi.task(kind="tests.recompute")
@dataclasses.dataclass
class Recompute(venturi.Task):
    """Coalesces: the merged job's `count` is the number of enqueues it stands for."""

    account: str
    count: int = 1

    def dedup_key(self) -> str | None:
        return f"account:{self.account}"

    def merge(self, existing: venturi.Existing[Recompute]) -> venturi.Merge:
        if existing.state == venturi.State.RUNNING:
            return venturi.Merge.enqueue()
        return venturi.Merge.update(
            dataclasses.replace(existing.payload, count=existing.payload.count + self.count)
        )

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "recompute", {"account": self.account, "count": self.count})
        return venturi.Outcome.completed()


@venturi.task(kind="tests.latest")
@dataclasses.dataclass
class Latest(venturi.Task):
    """Only the latest payload matters."""

    name: str
    value: int

    def dedup_key(self) -> str | None:
        return self.name

    def merge(self, existing: venturi.Existing[Latest]) -> venturi.Merge:
        return venturi.Merge.replace()

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "latest", self.value)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.once")
@dataclasses.dataclass
class Once(venturi.Task):
    """No merge method: a duplicate of a live job is dropped."""

    name: str
    value: int = 0

    def dedup_key(self) -> str | None:
        return self.name or None

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "once", self.value)
        return venturi.Outcome.completed()


@venturi.task(kind="tests.decides")
@dataclasses.dataclass
class Decides(venturi.Task):
    """Its payload says which decision `merge` returns, and records what merge saw."""

    name: str
    decision: str = "keep"
    value: int = 0
    run_at: datetime | None = None
    priority: int | None = None

    def dedup_key(self) -> str | None:
        return self.name

    def merge(self, existing: venturi.Existing[Decides]) -> venturi.Merge:
        SEEN.append(existing)
        priority = None if self.priority is None else venturi.Priority(self.priority)
        if self.decision == "keep":
            return venturi.Merge.keep()
        if self.decision == "replace":
            return venturi.Merge.replace(run_at=self.run_at, priority=priority)
        if self.decision == "update":
            merged = dataclasses.replace(
                existing.payload, value=existing.payload.value + self.value
            )
            return venturi.Merge.update(merged, run_at=self.run_at, priority=priority)
        if self.decision == "enqueue":
            return venturi.Merge.enqueue()
        if self.decision == "wrong":
            return venturi.Merge.update(dataclasses.replace(existing.payload, value="many"))
        if self.decision == "bad":
            return "nonsense"  # type: ignore[return-value]
        if self.decision.startswith("database:"):  # a query the database refuses
            with connections[self.decision.partition(":")[2]].cursor() as cursor:
                cursor.execute("SELECT * FROM venturi_no_such_table")
        raise RuntimeError(f"merge failed on purpose ({self.decision})")

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        record(ctx, "decides", self.value)
        return venturi.Outcome.completed()


SEEN: list[venturi.Existing[Decides]] = []
"""What `Decides.merge` was shown, in order (tests clear it)."""


@venturi.task(kind="tests.bad_key")
@dataclasses.dataclass
class BadKey(venturi.Task):
    key: object = None

    def dedup_key(self) -> str | None:
        return self.key  # type: ignore[return-value]

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@venturi.task(kind="tests.pausing_recompute", carry=int)
@dataclasses.dataclass
class PausingRecompute(venturi.Task):
    """A `Recompute` that pauses `steps` times before it completes."""

    account: str
    count: int = 1
    steps: int = 3

    def dedup_key(self) -> str | None:
        return self.account

    def merge(self, existing: venturi.Existing[PausingRecompute]) -> venturi.Merge:
        if existing.state == venturi.State.RUNNING:
            return venturi.Merge.enqueue()
        return venturi.Merge.update(
            dataclasses.replace(existing.payload, count=existing.payload.count + self.count)
        )

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        done = ctx.carry or 0
        if done < self.steps:
            time.sleep(0.01)
            return venturi.Outcome.paused(done + 1)
        record(ctx, "pausing_recompute", {"account": self.account, "count": self.count})
        return venturi.Outcome.completed()
