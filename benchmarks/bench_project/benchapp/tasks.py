"""The benchmark tasks.

SinkJob: an int payload, a handler that appends (i, time) to the sink (W1-W3).
CountJob: a keyed task whose clashes add up their `count` (W7, dedup under contention).
LimitedJob: a rate-limited kind, registered only when VENTURI_BENCH_RATE_LIMITED is set
(benchmarks/flow_control.py: a plain drain with and without a limited kind present).
StepJob: does nothing; the steps of the workflow benchmarks (benchmarks/workflows.py).
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta

import django_venturi as venturi
from benchmarks import sink

RATE_LIMITED_ENV = "VENTURI_BENCH_RATE_LIMITED"


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


if os.environ.get(RATE_LIMITED_ENV):

    @venturi.task(kind="bench.limited", rate_limit=venturi.RateLimit(10, per=timedelta(seconds=1)))
    @dataclasses.dataclass
    class LimitedJob(venturi.Task):
        """A rate-limited kind beside the drain (benchmarks/flow_control.py)."""

        i: int

        def handle(self, ctx: venturi.Context) -> venturi.Outcome:
            return venturi.Outcome.completed()
