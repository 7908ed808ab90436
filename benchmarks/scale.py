"""Issue #17's workloads: a realistic handler (W5), scale-out (W9), real payloads.

    python benchmarks/scale.py            # N = 10,000 (W9: 20,000), once (~5 min)
    python benchmarks/scale.py --quick    # smoke test: small N, < 60 s; exit 1 if a check fails
    python benchmarks/scale.py --workloads w5,claims --n 2000

W5       the no-op drain (`bench.sink`) and the ORM drain (`bench.orm`: read one `Counter`
         row, update one) at the same cell, their ratio, the database sessions opened
         during each drain (`pg_stat_database.sessions`), and the ORM handler's body
         alone in a loop (one thread, no queue).
W9       one backlog drained by 1, 2, 4 and 8 worker processes (concurrency 32, -v 0);
         then again "warm": the workers up and idle first, the backlog in one commit.
claims   claim statements per enqueue with 1 and 8 idle workers (a statement trigger counts them).
payload  W1b (`enqueue_many`) and W2 (1 process, concurrency 32, -v 0) with an int payload
         (`bench.sink`) and an eight-field one (`bench.rich`).

Every phase runs in a fresh database `venturi_scale_<phase>` (dropped at the end), set
up by `manage.py migrate`, with ANALYZE before each drain, measured by harness.py's `drain`
(WORKLOAD.md W2). Prints one markdown table, writes it to benchmarks/results/scale.md
(scale_quick.md with --quick); exits 1 if a check fails. See README.md.
"""

# This file is the entry point: the command line (`parse`), the phases in turn (`main`),
# and `produce`, handed to scale_producer.py. The phases are scale_w5.py, scale_w9.py,
# scale_claims.py and scale_payload.py, on scale_common.py; the table is scale_report.py's.

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.config import RESULTS_DIR  # noqa: E402
from benchmarks.harness import log  # noqa: E402
from benchmarks.scale_claims import run_claims  # noqa: E402
from benchmarks.scale_common import (  # noqa: E402
    DRAIN_CELL,
    W5_CELLS,
    W9_PROCESSES,
    WORK_DIR,
    WORKLOADS,
    Results,
    ScaleOptions,
)
from benchmarks.scale_payload import run_payload  # noqa: E402
from benchmarks.scale_producer import producer_main  # noqa: E402
from benchmarks.scale_report import build_table  # noqa: E402
from benchmarks.scale_w5 import run_w5  # noqa: E402
from benchmarks.scale_w9 import run_w9  # noqa: E402

# ---------------------------------------------------------------- main


def parse(argv: list[str] | None) -> ScaleOptions:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: small N, < 60 s")
    parser.add_argument("--n", type=int, default=None, help="jobs of W5 and payload (10,000)")
    parser.add_argument("--w9-n", type=int, default=None, help="jobs of each W9 drain (20,000)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=",".join(WORKLOADS))
    parser.add_argument("--host", default=os.environ.get("VENTURI_BENCH_HOST", "127.0.0.1"))
    parser.add_argument("--port", default=os.environ.get("VENTURI_BENCH_PORT", "5432"))
    parser.add_argument("--user", default=os.environ.get("VENTURI_BENCH_USER", "postgres"))
    args = parser.parse_args(argv)
    workloads = {w.strip().lower() for w in args.workloads.split(",") if w.strip()}
    if workloads - set(WORKLOADS):
        parser.error(f"unknown workloads: {', '.join(sorted(workloads - set(WORKLOADS)))}")
    quick = args.quick
    return ScaleOptions(
        n=args.n or (200 if quick else 10_000),
        repeat=1,
        grid=[],
        wake_count=0,
        wake_settle=0.5 if quick else 1.0,
        analyze=True,
        workloads=workloads,
        dsn_base={"host": args.host, "port": str(args.port), "user": args.user},
        quick=quick,
        output=RESULTS_DIR / ("scale_quick.md" if quick else "scale.md"),
        w9_n=args.w9_n or (400 if quick else 20_000),
        w9_processes=(1, 8) if quick else W9_PROCESSES,
        w5_cells=(DRAIN_CELL,) if quick else W5_CELLS,
        claim_jobs=5 if quick else 20,
        claim_tail=1.0,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = Results()
    phases = (("w5", run_w5), ("w9", run_w9), ("claims", run_claims), ("payload", run_payload))
    for name, phase in phases:
        if name in options.workloads:
            log(f"{name}:")
            phase(options, results)
    table, failures = build_table(options, results)
    footer = f"\nTotal time {time.monotonic() - started:.0f} s. " + (
        "All checks passed."
        if not failures
        else "FAILED CHECKS:\n" + "\n".join(f"- {failure}" for failure in failures)
    )
    print(table + footer)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(table + footer + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        raise SystemExit(producer_main(sys.argv[2:]))
    raise SystemExit(main())
