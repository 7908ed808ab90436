"""W3's schedule, shared by the venturi producer and the W4 limit."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.sink import SinkReader

PROBE_INDEX = 90_000_000
"""The readiness probe's `i`: not counted, and still 8 digits wide in the sink."""


def wake_schedule(
    enqueue: Callable[[int], Any],
    *,
    count: int,
    interval: float,
    sink_path: str,
    settle: float,
    wait: float,
) -> dict[str, Any]:
    """Probe, wait for it and `settle` s more, then enqueue i at t0 + i * interval.

    `enqueue(i)` must commit before it returns; `t_commit[i]` is the wall clock
    right after it returned. The harness reads the handler times from the sink.
    """
    reader = SinkReader(sink_path)
    enqueue(PROBE_INDEX)
    deadline = time.monotonic() + 30
    while PROBE_INDEX not in reader.times:
        if time.monotonic() > deadline:
            return {"error": "the probe job was never handled", "t_commit": []}
        time.sleep(0.005)
        reader.poll()
    time.sleep(settle)
    t_commit: list[float] = []
    t0 = time.monotonic() + 0.05
    for i in range(count):
        pause = t0 + i * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        enqueue(i)
        t_commit.append(time.time())
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        reader.poll()
        if all(i in reader.times for i in range(count)):
            break
        time.sleep(0.005)
    return {"t_commit": t_commit}
