"""The benchmark tasks.

SinkJob: an int payload, a handler that appends (i, time) to the sink (W1-W3).
CountJob: a keyed task whose clashes add up their `count` (W7, dedup under contention).
LimitedJob: a rate-limited kind, registered only when VENTURI_BENCH_RATE_LIMITED is set
(benchmarks/flow_control.py: a plain drain with and without a limited kind present).
RatedJob: the sink handler limited to 50 starts a second, registered only when
VENTURI_BENCH_RATED is set (benchmarks/rate_limits.py).
KeyCappedJob: at most 2 running per `key`, registered only when VENTURI_BENCH_KEY_CAPPED
is set (benchmarks/key_caps.py, and flow_control.py's `keyed` variant); SleepJob: the
same handler without a cap (key_caps.py's reference).
FairJob: the sink handler, its jobs taking turns by `key`; registered only when
VENTURI_BENCH_FAIR is set (fairness.py --tenants, flow_control.py's fair variants).
StepJob: does nothing; the steps of the workflow benchmarks (benchmarks/workflows.py).
OrmJob: W5's realistic handler, one read and one update of a `Counter` row through the ORM
(benchmarks/scale.py).
RichJob: the sink handler with an eight-field payload (benchmarks/scale.py, "real payloads").
"""

from __future__ import annotations

import dataclasses
import enum
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import F
from django.utils import timezone

import django_venturi as venturi
from benchmarks import sink
from benchmarks.bench_project.benchapp.models import Counter

RATE_LIMITED_ENV = "VENTURI_BENCH_RATE_LIMITED"
RATED_ENV = "VENTURI_BENCH_RATED"
KEY_CAPPED_ENV = "VENTURI_BENCH_KEY_CAPPED"
FAIR_ENV = "VENTURI_BENCH_FAIR"
ENDED = 50_000_000
"""A sleeping job appends its end to the sink under its index plus this."""


@venturi.task(kind="bench.sink")
@dataclasses.dataclass
class SinkJob(venturi.Task):
    i: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        sink.handle(self.i)
        return venturi.Outcome.completed()


@venturi.task(kind="bench.count")
@dataclasses.dataclass
class CountJob(venturi.Task):
    key: int
    count: int = 1

    def dedup_key(self) -> str | None:
        return f"k{self.key}"

    def merge(self, existing: venturi.Existing[CountJob]) -> venturi.Merge:
        merged = dataclasses.replace(existing.payload, count=existing.payload.count + self.count)
        return venturi.Merge.update(merged)

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


@venturi.task(kind="bench.step")
@dataclasses.dataclass
class StepJob(venturi.Task):
    i: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        return venturi.Outcome.completed()


COUNTER_ROWS = 1_000
"""`Counter` rows the W5 harness seeds (ids 1..COUNTER_ROWS); job i touches row i % ROWS + 1."""


@venturi.task(kind="bench.orm")
@dataclasses.dataclass
class OrmJob(venturi.Task):
    """A realistic handler: read one row, then update one row, through the Django ORM."""

    i: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        sink.handle(self.i)
        row = Counter.objects.get(pk=self.i % COUNTER_ROWS + 1)
        Counter.objects.filter(pk=row.pk).update(value=F("value") + 1, touched_at=timezone.now())
        return venturi.Outcome.completed()


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


@dataclasses.dataclass
class Address:
    street: str
    city: str


@venturi.task(kind="bench.rich")
@dataclasses.dataclass
class RichJob(venturi.Task):
    """The sink handler with a payload of eight typed fields (one a nested dataclass)."""

    i: int
    at: datetime
    amount: Decimal
    ref: uuid.UUID
    colour: Colour
    tags: list[str]
    address: Address
    note: str

    @classmethod
    def example(cls, i: int) -> RichJob:
        """Job i's payload: every field varies with i, as real payloads would."""
        return cls(
            i=i,
            at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i),
            amount=Decimal(i) / 100 + Decimal("0.05"),
            ref=uuid.UUID(int=i + 1),
            colour=list(Colour)[i % 3],
            tags=["bench", f"batch-{i // 1000}", f"shard-{i % 16}"],
            address=Address(street=f"{i} Rue de la République", city="Lyon"),
            note=f"order {i}: two boxes, leave at the door",
        )

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        sink.handle(self.i)
        return venturi.Outcome.completed()


if os.environ.get(RATE_LIMITED_ENV):

    @venturi.task(kind="bench.limited", rate_limit=venturi.RateLimit(10, per=timedelta(seconds=1)))
    @dataclasses.dataclass
    class LimitedJob(venturi.Task):
        """A rate-limited kind beside the drain (benchmarks/flow_control.py)."""

        i: int

        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            return venturi.Outcome.completed()


if os.environ.get(RATED_ENV):
    from benchmarks.rate_limits import RATED_PER_SECOND

    @venturi.task(
        kind="bench.rated",
        rate_limit=venturi.RateLimit(RATED_PER_SECOND, per=timedelta(seconds=1)),
    )
    @dataclasses.dataclass
    class RatedJob(venturi.Task):
        """The sink handler at most 50 starts a second (benchmarks/rate_limits.py)."""

        i: int

        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            sink.handle(self.i)
            return venturi.Outcome.completed()


def sleep_and_record(i: int, seconds: float) -> None:
    """Append the start (at i) and the end (at i + ENDED) of a handler that sleeps."""
    sink.handle(i)
    time.sleep(seconds)
    sink.handle(i + ENDED)


@venturi.task(kind="bench.sleep")
@dataclasses.dataclass
class SleepJob(venturi.Task):
    i: int
    key: int
    seconds: float

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        sleep_and_record(self.i, self.seconds)
        return venturi.Outcome.completed()


if os.environ.get(KEY_CAPPED_ENV):

    @venturi.task(kind="bench.key_capped", concurrency=venturi.Concurrency(2, key="key"))
    @dataclasses.dataclass
    class KeyCappedJob(venturi.Task):
        """At most 2 running per key, across every worker."""

        i: int
        key: int
        seconds: float

        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            sleep_and_record(self.i, self.seconds)
            return venturi.Outcome.completed()


if os.environ.get(FAIR_ENV):

    @venturi.task(kind="bench.fair", fair_by="key")
    @dataclasses.dataclass
    class FairJob(venturi.Task):
        """The sink handler; its due jobs take turns by key."""

        i: int
        key: str

        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            sink.handle(self.i)
            return venturi.Outcome.completed()
