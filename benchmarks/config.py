"""The suite's configuration: paths, worker cells and grids, workload sizes, `Options`.

`Cell` is one venturi worker configuration (processes x `venturi_worker` flags);
`FULL_GRID`, `GRID` and `QUICK_GRID` are W2b's grids; then the sizes of W2c, W6, W7
and W8 (full and `--quick`). `Options` is what one invocation of `run.py` measures
(`run.parse` builds it; `scale.py` and `workflows.py` build theirs).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from benchmarks import peer_pgqueuer as pgq

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SETTINGS = "benchmarks.bench_project.settings"
RESULTS_DIR = BENCH_DIR / "results"
WORK_DIR = RESULTS_DIR / "run"

# ---------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class Cell:
    """One venturi worker configuration: processes x `venturi_worker` flags."""

    processes: int
    concurrency: int | None = None
    batch_size: int | None = None
    verbosity: int | None = None

    def flags(self) -> list[str]:
        flags: list[str] = []
        if self.concurrency is not None:
            flags += ["--concurrency", str(self.concurrency)]
        if self.batch_size is not None:
            flags += ["--batch-size", str(self.batch_size)]
        if self.verbosity is not None:
            flags += ["--verbosity", str(self.verbosity)]
        return flags

    def label(self) -> str:
        if self == DEFAULTS:
            return "1 process, defaults (concurrency 10, batch 500, -v 1)"
        parts = [f"{self.processes} process{'es' if self.processes > 1 else ''}"]
        parts.append(f"concurrency {self.concurrency or 10}")
        parts.append(f"batch {self.batch_size or 500}")
        parts.append(f"-v {1 if self.verbosity is None else self.verbosity}")
        return ", ".join(parts)


DEFAULTS = Cell(processes=1)

# A claim takes min(free handler slots, batch size) jobs, so the batch size only
# matters when it is below the concurrency: the grid varies the concurrency, with
# the batch size at its default or raised to match it. -v 0 logs warnings only;
# one cell keeps the default -v 1 (an INFO line per job) to show what that costs.
FULL_GRID = [
    Cell(1, 10, 100, 0),
    Cell(1, 32, 100, 0),
    Cell(1, 128, 100, 0),
    Cell(1, 500, 500, 0),
    Cell(2, 10, 100, 0),
    Cell(2, 32, 100, 0),
    Cell(2, 128, 100, 0),
    Cell(2, 500, 500, 0),
    Cell(4, 128, 100, 0),
    Cell(1, 128, 100, None),
]
# The default grid: the cells that matter beside the PgQueuer peer (`--cells full`: all).
GRID = [
    Cell(1, 16, 500, 0),
    Cell(2, 8, 500, 0),
    Cell(2, 8, 1000, 0),
    Cell(1, 16, 500, None),
]
QUICK_GRID = [Cell(1, 32, 100, 0), Cell(2, 32, 100, 0)]
W2C_CELL = Cell(2, 8, 1000, 0)
"""W2c's venturi configuration when no W2b cell of at most 2 processes ran."""
W2C_N = 100_000
QUICK_W2C_N = 1_000
PEERS = ("pgqueuer",)

LIMIT_DRAINS = [("claim1", 1), ("batch100", 1), ("batch100", 2)]

WORKLOADS = ("w4", "w1", "w2a", "w1b", "w2b", "w2c", "w3", "w6", "w7", "w8")

# W6: claim-and-complete TARGET jobs beside a large table of jobs the worker does
# not take: ready jobs due tomorrow (same kind, queue, tier and rank, so they sit in
# the very range of the claim index the claim walks, past the due ones), or
# finished jobs (outside the partial index altogether).
W6_TARGET = 5_000
W6_CASES = (
    ("ready_10k", "ready", 10_000),
    ("ready_1m", "ready", 1_000_000),
    ("finished_1m", "finished", 1_000_000),
)
QUICK_W6_TARGET = 100
QUICK_W6_CASES = (
    ("ready_10k", "ready", 1_000),
    ("ready_1m", "ready", 10_000),
    ("finished_1m", "finished", 10_000),
)
W6_CELL = Cell(1, 32, 100, 0)
"""W6 and W8 run one worker process at concurrency 32 without the per-job log line."""

# W8: worker RSS after a warm-up, then every W8_STEP jobs up to W8_JOBS more.
W8_WARMUP = 1_000
W8_JOBS = 100_000
W8_STEP = 10_000
QUICK_W8 = (100, 1_000, 250)
W8_TIMEOUT = 300.0

# W7: producers x enqueues each over DEDUP_KEYS keys (key = i % DEDUP_KEYS).
DEDUP_PRODUCERS = 8
DEDUP_PER_PRODUCER = 250
QUICK_DEDUP_PER_PRODUCER = 13
DEDUP_KEYS = 10
DEDUP_TIMEOUT = 300.0


def dedup_margin(producers: int) -> float:
    """Seconds from spawning the W7 producers to their common start: time to set up Django."""
    return 2.0 + 0.75 * producers


@dataclasses.dataclass
class Options:
    n: int
    repeat: int
    grid: list[Cell]
    wake_count: int
    wake_settle: float
    analyze: bool
    workloads: set[str]
    dsn_base: dict[str, str]
    quick: bool
    output: Path
    dedup_per_producer: int = DEDUP_PER_PRODUCER
    w6_target: int = W6_TARGET
    w6_cases: tuple[tuple[str, str, int], ...] = W6_CASES
    w8: tuple[int, int, int] = (W8_WARMUP, W8_JOBS, W8_STEP)
    """Warm-up jobs, measured jobs, jobs between RSS samples."""
    chart: Path | None = None
    peers: set[str] = dataclasses.field(default_factory=set)
    """Peer libraries run beside venturi (`pgqueuer`), once found importable."""
    pgq_grid: list[pgq.PgqCell] = dataclasses.field(default_factory=list)
    w2c_n: int = W2C_N
    pgq_dsn: str = ""
    """The database PgQueuer's workers connect to (`child_env` passes it on)."""
    run: int = 0
    """The repetition being run (0-based): names the log and sink files."""

    def artifact(self, name: str) -> Path:
        return WORK_DIR / f"run{self.run + 1}_{name}"
