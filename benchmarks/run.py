"""django-venturi benchmark suite: WORKLOAD.md's W1, W1b, W2a, W2b, W3, the W4 limit, and W7.

    python benchmarks/run.py            # full run (N=10,000, three alternating rounds)
    python benchmarks/run.py --quick    # CI smoke test (N=100, once): exits 1 if a check fails
    python benchmarks/run.py --n 2000 --repeat 1 --workloads w1,w2a

Every phase runs in a freshly created database (dropped at the end) whose schema
`manage.py migrate` installs (the W4 limit: its one CREATE TABLE). Prints one
markdown table and writes it to benchmarks/results/latest.md; see README.md.
W7 (dedup under contention) is this suite's own: 8 producers enqueue keyed jobs at once.
The PgQueuer peer (benchmarks/peer_pgqueuer.py) runs the same workloads in the same
rounds as venturi and W4, in alternating order; `--no-peers` leaves it out.
"""

# This file is the entry point only: the command line (`parse`) and `main`. The suite
# itself is runner.py (the rounds), drains.py (W1, W1b, W2), latency.py (W3),
# backlog.py (W6), dedup.py (W7) and memory.py (W8), on harness.py, config.py and
# results.py; the table and the chart are report.py's.

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import peer_pgqueuer as pgq  # noqa: E402
from benchmarks.config import (  # noqa: E402
    DEDUP_PER_PRODUCER,
    FULL_GRID,
    GRID,
    PEERS,
    QUICK_DEDUP_PER_PRODUCER,
    QUICK_GRID,
    QUICK_W2C_N,
    QUICK_W6_CASES,
    QUICK_W6_TARGET,
    QUICK_W8,
    RESULTS_DIR,
    W2C_N,
    W6_CASES,
    W6_TARGET,
    W8_JOBS,
    W8_STEP,
    W8_WARMUP,
    WORKLOADS,
    Cell,
    Options,
)
from benchmarks.harness import log  # noqa: E402
from benchmarks.runner import run_suite  # noqa: E402


def parse_cells(text: str) -> list[Cell]:
    """`PxC[xB[xV]]` cells, comma-separated: processes, concurrency, batch size, verbosity."""
    cells = []
    for spec in text.split(","):
        numbers = [int(part) for part in spec.strip().split("x")]
        if not 2 <= len(numbers) <= 4:
            raise SystemExit(f"--cells: {spec!r} is not PxC[xB[xV]]")
        cells.append(Cell(*numbers))  # type: ignore[arg-type]
    return cells


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke test: N=100, one run")
    parser.add_argument("--n", type=int, default=None, help="jobs per W1/W2 phase (10,000)")
    parser.add_argument("--repeat", type=int, default=None, help="runs of the sequence (2)")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--no-analyze", action="store_true", help="skip the ANALYZE before each drain"
    )
    parser.add_argument("--host", default=os.environ.get("VENTURI_BENCH_HOST", "127.0.0.1"))
    parser.add_argument("--port", default=os.environ.get("VENTURI_BENCH_PORT", "5432"))
    parser.add_argument("--user", default=os.environ.get("VENTURI_BENCH_USER", "postgres"))
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="where to write the table (results/latest.md; with --quick, results/quick.md)",
    )
    parser.add_argument(
        "--cells",
        default=None,
        help="W2b cells instead of the grid, e.g. 1x32x100x0,2x128 (processes x concurrency "
        "[x batch size [x verbosity]]), or `full` for the whole published grid",
    )
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="peer libraries to run beside venturi, comma-separated (pgqueuer)",
    )
    parser.add_argument("--no-peers", action="store_true", help="venturi and W4 only")
    parser.add_argument(
        "--chart",
        type=Path,
        default=None,
        help="where to draw the chart (results/latest.png; the docs show docs/benchmarks.png)",
    )
    args = parser.parse_args(argv)
    workloads = {w.strip().lower() for w in args.workloads.split(",") if w.strip()}
    unknown = workloads - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    n = args.n or (100 if args.quick else 10_000)
    if args.cells == "full":
        grid = FULL_GRID
    else:
        grid = parse_cells(args.cells) if args.cells else QUICK_GRID if args.quick else GRID
    return Options(
        n=n,
        repeat=args.repeat or (1 if args.quick else 3),
        grid=grid,
        wake_count=20 if args.quick else 200,
        wake_settle=0.5 if args.quick else 1.0,
        analyze=not args.no_analyze,
        workloads=workloads,
        dsn_base={"host": args.host, "port": str(args.port), "user": args.user},
        quick=args.quick,
        output=args.output or RESULTS_DIR / ("quick.md" if args.quick else "latest.md"),
        dedup_per_producer=QUICK_DEDUP_PER_PRODUCER if args.quick else DEDUP_PER_PRODUCER,
        w6_target=QUICK_W6_TARGET if args.quick else W6_TARGET,
        w6_cases=QUICK_W6_CASES if args.quick else W6_CASES,
        w8=QUICK_W8 if args.quick else (W8_WARMUP, W8_JOBS, W8_STEP),
        chart=args.chart or RESULTS_DIR / ("quick.png" if args.quick else "latest.png"),
        peers=set() if args.no_peers else peers(parser, args.peers),
        pgq_grid=pgq.PGQ_QUICK_GRID if args.quick else pgq.PGQ_GRID,
        w2c_n=QUICK_W2C_N if args.quick else W2C_N,
    )


def peers(parser: argparse.ArgumentParser, text: str) -> set[str]:
    """The peers asked for that can run; one that is not installed is skipped, and said so."""
    asked = {p.strip().lower() for p in text.split(",") if p.strip()}
    unknown = asked - set(PEERS)
    if unknown:
        parser.error(f"unknown peers: {', '.join(sorted(unknown))}")
    if "pgqueuer" in asked and (missing := pgq.available()):
        log(f"PgQueuer skipped ({missing}; pip install -e '.[bench]')")
        asked.discard("pgqueuer")
    return asked


def main(argv: list[str] | None = None) -> int:
    return run_suite(parse(argv))


if __name__ == "__main__":
    raise SystemExit(main())
