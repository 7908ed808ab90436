"""Real payloads of `scale.py`: W1b and W2 with an int payload and an eight-field one.

`run_payload` enqueues N `bench.sink` jobs (one int) and N `bench.rich` jobs (eight
fields: datetime, Decimal, UUID, an Enum, a list, a nested dataclass, ...), each with
one `enqueue_many` in its own database, and drains them with `DRAIN_CELL`.
"""

from __future__ import annotations

from benchmarks.harness import log
from benchmarks.results import describe
from benchmarks.scale_common import (
    DRAIN_CELL,
    Measured,
    Results,
    ScaleOptions,
    bulk,
    measured_drain,
    scale_database,
)

# ---------------------------------------------------------------- real payloads


def run_payload(options: ScaleOptions, results: Results) -> None:
    for task in ("sink", "rich"):
        with scale_database(options, f"payload_{task}") as dbname:
            rate = bulk(options, dbname, task, options.n)
            drained, sessions = measured_drain(
                options, dbname, DRAIN_CELL, f"payload_{task}", options.n
            )
        results.payload[task] = Measured(drained, enqueue_rate=rate, sessions=sessions)
        log(f"  payload {task}: enqueue_many {rate:,.0f} jobs/s; {describe(drained)}")
