"""What a run measures: the records of one repetition, and their one-line descriptions.

`Drain` (W2, W4, W6), `Wake` (W3), `Dedup` (W7) and `Memory` (W8) each hold one
measurement and say which checks it failed (`problems()`); `Record` holds every
measurement of one repetition. `describe` and `describe_wake` are the progress log's
lines, `fmt` formats a figure (`MISSING` when there is none).
"""

from __future__ import annotations

import dataclasses

MISSING = "n/a"

# ---------------------------------------------------------------- results


@dataclasses.dataclass
class Drain:
    n: int
    handled: int
    steady: float | None
    startup: float | None
    done: float | None
    timeout: bool
    duplicates: int
    unfinished: int
    done_once: int
    malformed: int
    seconds: float
    flow: float | None
    """N / (t_all_done - t_first): the claim-and-complete rate without start-up (W6)."""
    longest_pause: float | None
    """The longest gap between consecutive handler entries, in ms: a stall detector."""
    exits: list[int]
    first_entry: float | None = None
    """From t_spawn to the first handler entry, in ms: start-up."""
    """Return codes of worker processes that exited before they were stopped."""

    def problems(self) -> list[str]:
        found = []
        if self.exits:
            found.append(f"worker exited early (codes {self.exits})")
        if self.timeout:
            found.append(f"timeout, {self.handled}/{self.n} handled")
        elif self.handled != self.n:
            found.append(f"{self.handled}/{self.n} handled")
        if self.duplicates:
            found.append(f"{self.duplicates} i handled twice")
        if self.unfinished:
            found.append(f"{self.unfinished} jobs unfinished")
        if self.done_once != self.n:
            found.append(f"{self.done_once}/{self.n} finished after exactly one run")
        if self.malformed:
            found.append(f"{self.malformed} malformed sink lines")
        return found


@dataclasses.dataclass
class Wake:
    count: int
    received: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    duplicates: int
    error: str = ""
    latencies: list[float] = dataclasses.field(default_factory=list)
    """Every latency received, in ms (for the chart)."""

    def problems(self) -> list[str]:
        found = []
        if self.error:
            found.append(self.error)
        if self.received != self.count:
            found.append(f"{self.received}/{self.count} received")
        if self.duplicates:
            found.append(f"{self.duplicates} i handled twice")
        return found


@dataclasses.dataclass
class Dedup:
    """W7: concurrent keyed enqueues, and what the database holds afterwards."""

    producers: int
    per_producer: int
    keys: int
    elapsed: float | None
    """From the common start to the end of the last producer, in s."""
    rate: float | None
    live: int
    count_sum: int
    merged: int
    rows: int
    late: list[float]
    """Seconds by which producers were set up only after the common start."""
    slack: float | None
    """The shortest wait of a producer at the start barrier, in s."""
    errors: list[str]

    @property
    def total(self) -> int:
        return self.producers * self.per_producer

    def problems(self) -> list[str]:
        found = list(self.errors)
        if self.late:
            lates = ", ".join(f"{t:.2f}" for t in self.late)
            found.append(f"{len(self.late)} producer(s) ready after the start barrier (+{lates} s)")
        if self.live != self.keys:
            found.append(f"{self.live} live jobs, expected {self.keys}")
        if self.count_sum != self.total:
            found.append(f"sum of count {self.count_sum:,}, expected {self.total:,}")
        return found


@dataclasses.dataclass
class Record:
    """Every measurement of one repetition, keyed by a short name."""

    enqueue: dict[str, float] = dataclasses.field(default_factory=dict)
    drains: dict[str, Drain] = dataclasses.field(default_factory=dict)
    wakes: dict[str, Wake] = dataclasses.field(default_factory=dict)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)
    dedup: Dedup | None = None
    memory: Memory | None = None


@dataclasses.dataclass
class Memory:
    """W8: the worker's resident set size, sampled as it works through many jobs."""

    warmup: int
    jobs: int
    samples: list[tuple[int, int]]
    """(jobs handled since the warm-up, VmRSS in kB), the first one after the warm-up."""
    handled: int
    duplicates: int
    unfinished: int
    seconds: float
    error: str = ""

    @property
    def growth_mb(self) -> float | None:
        if len(self.samples) < 2:
            return None
        return (self.samples[-1][1] - self.samples[0][1]) / 1024

    def problems(self) -> list[str]:
        found = [self.error] if self.error else []
        if self.handled != self.warmup + self.jobs:
            found.append(f"{self.handled:,}/{self.warmup + self.jobs:,} handled")
        if self.duplicates:
            found.append(f"{self.duplicates} i handled twice")
        if self.unfinished:
            found.append(f"{self.unfinished} jobs unfinished")
        return found


# ---------------------------------------------------------------- descriptions


def describe(result: Drain) -> str:
    figures = " / ".join(fmt(v) for v in (result.steady, result.startup, result.done))
    problems = "; ".join(result.problems())
    return f"{figures} jobs/s (steady / incl. start-up / all done), {result.seconds:.1f} s" + (
        f" [{problems}]" if problems else ""
    )


def describe_wake(result: Wake) -> str:
    figures = " / ".join(fmt(v, 1) for v in (result.p50, result.p95, result.p99, result.max))
    problems = "; ".join(result.problems())
    return f"p50/p95/p99/max {figures} ms, {result.received}/{result.count}" + (
        f" [{problems}]" if problems else ""
    )


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return MISSING
    return f"{value:,.{digits}f}"
