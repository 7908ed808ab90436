"""The one benchmark task: an int payload, a handler that appends (i, time) to the sink."""

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
