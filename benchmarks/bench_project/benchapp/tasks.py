"""The benchmark tasks.

SinkJob: an int payload, a handler that appends (i, time) to the sink (W1-W3).
CountJob: a keyed task whose clashes add up their `count` (W7, dedup under contention).
StepJob: does nothing; the steps of the workflow benchmarks (benchmarks/workflows.py).
"""

from __future__ import annotations

import dataclasses

import django_venturi as venturi
from benchmarks import sink


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
